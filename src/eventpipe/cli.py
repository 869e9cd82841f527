"""The ``eventpipe`` command: one subcommand per verb, each thin (parse, call, print).

Every command takes ``-c/--config FILE`` (default ``./eventpipe.yaml``; built-in embedded
defaults when that file does not exist). Errors print as ``error: ...`` with the fix, and
exit with 2 for configuration errors, 1 for the rest.
"""

from __future__ import annotations

import logging
import secrets
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import click

from eventpipe import __version__
from eventpipe.config import DEFAULT_CONFIG_PATH, LoadedConfig, load_config
from eventpipe.errors import ConfigError, EventpipeError, QueryError
from eventpipe.files import write_file
from eventpipe.logs import configure_logging

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def config_option(func: F) -> F:
    return click.option(
        "-c",
        "--config",
        "config_path",
        type=click.Path(path_type=Path, dir_okay=False),
        default=None,
        help=f"Config file (default ./{DEFAULT_CONFIG_PATH}; built-in defaults if absent).",
    )(func)


def _load(config_path: Path | None) -> LoadedConfig:
    loaded = load_config(config_path)
    configure_logging(loaded.config.logging)
    return loaded


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="eventpipe")
def cli() -> None:
    """eventpipe: collect events over HTTP, keep them durably, load them into warehouses."""


@cli.command()
@config_option
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def init(config_path: Path | None, force: bool) -> None:
    """Write a commented reference eventpipe.yaml with fresh random keys."""
    target = config_path or DEFAULT_CONFIG_PATH
    if target.exists() and not force:
        raise ConfigError(f"{target} already exists", fix="pass --force to overwrite it")
    text = resources.files("eventpipe").joinpath("reference.yaml").read_text(encoding="utf-8")
    text = text.replace("__JS_SECRET__", "js." + secrets.token_urlsafe(18))
    text = text.replace("__SERVER_SECRET__", "s2s." + secrets.token_urlsafe(18))
    write_file(target, text, private=True)  # it holds secrets
    click.echo(f"wrote {target}; edit it, then run `eventpipe collect -c {target}`")


@cli.command()
@config_option
@click.option("--host", default=None, help="Override server.host.")
@click.option("--port", type=int, default=None, help="Override server.port.")
def collect(config_path: Path | None, host: str | None, port: int | None) -> None:
    """Run the HTTP collector alone (scale it out on many nodes)."""
    from eventpipe.collector.server import serve

    loaded = _load(config_path)
    overrides = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    if overrides:
        server = loaded.config.server.model_copy(update=overrides)
        loaded = loaded.model_copy(
            update={"config": loaded.config.model_copy(update={"server": server})}
        )
    serve(loaded)


@cli.command("run")
@config_option
def run_command(config_path: Path | None) -> None:
    """Collector and batch pipeline together, supervised; Ctrl-C stops both cleanly."""
    from eventpipe.service import run

    run(_load(config_path), config_path)


@cli.command()
@config_option
def rotate(config_path: Path | None) -> None:
    """Seal the active segments now (asks a running collector, or seals them itself)."""
    from eventpipe.collector.app import log_settings
    from eventpipe.log.segments import rotate_now

    config = _load(config_path).config
    sealed = rotate_now(config.layout, log_settings(config))
    if not sealed:
        click.echo("nothing to seal: no active segment has events")
    for path in sealed:
        click.echo(f"sealed {path}")


@cli.command()
@config_option
@click.option("--once", is_flag=True, help="Process what is sealed now, then exit (cron, Airflow).")
def process(config_path: Path | None, once: bool) -> None:
    """Run the Spark batch pipeline over sealed segments."""
    import signal

    from eventpipe.errors import retry_transient
    from eventpipe.processing import shutdown, stream
    from eventpipe.processing.job import process_pending
    from eventpipe.processing.run import PipelineBusyError
    from eventpipe.processing.spark import start_session

    config = _load(config_path).config
    spark = start_session(config.spark.settings)
    # SIGTERM (from `eventpipe run`, or an init system): nothing new starts, loads under
    # way get shutdown_grace_seconds to finish and record their progress (a second
    # SIGTERM, or Ctrl-C: at once). What is cut short resumes with its batch ids.
    grace = config.processing.shutdown_grace_seconds
    signal.signal(signal.SIGTERM, lambda signum, frame: shutdown.request(grace))
    period = config.processing.batch_period_seconds
    log = logging.getLogger("eventpipe.processing")
    # Stream destinations: one streaming query each, beside the batch runs (--once: up to
    # what the log holds now, then the batch run).
    streams = stream.StreamSupervisor(spark, config)
    try:
        if once:
            stream.run_once(spark, config)
        else:
            streams.start()
        while True:
            try:
                # A destination that is down stops alone: the others load, and it tries
                # again after 1 s, 2 s, 4 s... up to the batch period (--once: 3 tries).
                reports = retry_transient(
                    lambda: process_pending(config, spark), attempts=3 if once else None,
                    max_delay=max(period, 1.0), log=log, unless=(PipelineBusyError,),
                    sleep=shutdown.pause,
                )  # fmt: skip
            except PipelineBusyError as exc:
                if once:
                    raise
                log.warning("%s; next try later", exc)
                shutdown.pause(period)
                continue
            if not reports:
                click.echo("nothing to process: no sealed segment")
            for report in reports:
                _print_report(report)
            if once or shutdown.wait(period):
                return
    finally:
        streams.stop()
        spark.stop()


@cli.group()
def replay() -> None:
    """Send events through the pipeline again."""


@replay.command("failed")
@config_option
@click.option("--destination", "destination_id", required=True, help="The destination id.")
def replay_failed_command(config_path: Path | None, destination_id: str) -> None:
    """Replay data/failed/failed.dst=ID.log: what loads leaves failed/ (archived), what
    fails again stays there with its new error."""
    from eventpipe.processing.replay import replay_failed

    config = _load(config_path).config
    config.destination(destination_id)
    report = _with_spark(config, lambda spark: replay_failed(config, spark, destination_id))
    if report is None:
        click.echo(f"nothing to replay: no failed events for {destination_id}")
    else:
        _print_report(report)


@cli.command()
@config_option
@click.option(
    "--from",
    "first",
    type=click.DateTime(["%Y-%m-%d"]),
    required=True,
    help="First day (YYYY-MM-DD, UTC day of _timestamp).",
)
@click.option(
    "--to",
    "last",
    type=click.DateTime(["%Y-%m-%d"]),
    default=None,
    help="Last day, included (default: --from).",
)
@click.option(
    "--destination",
    "destination_ids",
    multiple=True,
    help="Only this destination (repeatable; default: every duckdb, postgres and local "
    "parquet one without metering).",
)
@click.option("--force", is_flag=True, help="Rebuild every day of the range, up to date or not.")
@click.option("--dry-run", is_flag=True, help="Print what would be rebuilt and why.")
def reprocess(
    config_path: Path | None,
    first: Any,
    last: Any,
    destination_ids: tuple[str, ...],
    force: bool,
    dry_run: bool,
) -> None:
    """Rebuild days from the raw archive: each day (by _timestamp) whose rows were built
    with another code version, or whose archive files changed (every day with --force),
    has its rows replaced in one transaction. Interrupted, it resumes where it stopped."""
    import signal

    from eventpipe.processing import reprocess as rp
    from eventpipe.processing import shutdown
    from eventpipe.state.store import open_state

    config = _load(config_path).config
    start, end = first.date(), (last or first).date()
    if end < start:
        raise ConfigError(f"--to {end} is before --from {start}")
    targets = list(destination_ids) or rp.batch_ids(config)
    if not targets:
        raise ConfigError("no duckdb, postgres or local parquet destination to reprocess")
    for dest_id in targets:
        rp.replaceable(config, dest_id)
    state = open_state(config)
    plans = {d: rp.plan(config, state, d, start, end, force) for d in targets}
    if dry_run:
        for todo in plans.values():
            _print_plan(todo)
        return
    grace = config.processing.shutdown_grace_seconds
    signal.signal(signal.SIGTERM, lambda signum, frame: shutdown.request(grace))
    refused = 0

    def summary(dest_id: str, todo: Any, results: list[Any]) -> None:
        nonlocal refused
        for day, why in todo.refused:
            click.echo(f"{dest_id} {day}: not rebuilt: {why}")
        refused += len(todo.refused)
        days = sum(len(result.plan.days) for result in results)
        click.echo(
            f"{dest_id}: {days} day(s) rebuilt, {len(todo.up_to_date)} up to "
            f"date, {len(todo.refused)} refused (code version {todo.version})"
        )

    def run(spark: Any) -> None:
        for dest_id in targets:
            todo, results = rp.reprocess(spark, config, dest_id, start, end, force=force,
                                         progress=click.echo)  # fmt: skip
            summary(dest_id, todo, results)

    if any(todo.groups for todo in plans.values()):
        _with_spark(config, run)
    else:  # nothing to rebuild: no Spark session (15 s) for nothing
        for dest_id, todo in plans.items():
            summary(dest_id, todo, [])
    if refused:
        raise EventpipeError(f"{refused} day(s) could not be rebuilt (listed above)")


def _print_plan(todo: Any) -> None:
    for group in todo.groups:
        for day, why in zip(group.days, group.reasons, strict=True):
            click.echo(f"{group.destination} {day}: would rebuild: {why}; "
                       f"{len(group.sources)} file(s)")  # fmt: skip
    for day, why in todo.refused:
        click.echo(f"{day}: not rebuilt: {why}")
    days = sum(len(group.days) for group in todo.groups)
    click.echo(f"{days} day(s) to rebuild in {len(todo.groups)} run(s), "
               f"{len(todo.up_to_date)} up to date, {len(todo.refused)} refused "
               f"(code version {todo.version})")  # fmt: skip


@cli.group("archive")
def archive_group() -> None:
    """The raw archive of processed segments: verify its checksums, read events back."""


_DAY = click.DateTime(["%Y-%m-%d"])


@archive_group.command("verify")
@config_option
@click.option("--from", "first", type=_DAY, default=None, help="First day (YYYY-MM-DD).")
@click.option("--to", "last", type=_DAY, default=None, help="Last day (included).")
def archive_verify(config_path: Path | None, first: Any, last: Any) -> None:
    """Recompute every size and checksum of the archive (all days, or --from/--to) and
    name each file and frame that does not match. Exits 1 if one does not."""
    from eventpipe.archive.verify import verify

    layout = _load(config_path).config.layout
    report = verify(
        layout,
        first.date() if first else None,
        last.date() if last else None,
        progress=lambda path: logging.getLogger("eventpipe.archive").debug("verify %s", path),
    )
    for problem in report.problems:
        click.echo(f"MISMATCH {problem}")
    summary = (
        f"{report.days} day(s), {report.files} file(s), {report.frames:,} frame(s), "
        f"{report.events:,} event(s), {report.compressed_bytes / 1e6:.1f} MB"
    )
    if report.problems:
        raise EventpipeError(
            f"{len(report.problems)} problem(s) in {summary}",
            fix="a damaged file can be archived again from a copy of its segment, or "
            "deleted with its sidecars; docs/archive.md",
        )
    click.echo(f"ok: {summary}")


@archive_group.command("cat")
@config_option
@click.option("--day", required=True, type=_DAY, help="The archive day (YYYY-MM-DD).")
@click.option("--event-id", default=None, help="Only the event(s) with this eventn_ctx.event_id.")
def archive_cat(config_path: Path | None, day: Any, event_id: str | None) -> None:
    """Print a day's archived events, in log order, one JSON per line; with --event-id,
    only that event (one frame is read), its position on stderr."""
    from eventpipe.archive.files import segments_of_day
    from eventpipe.archive.read import find, lines
    from eventpipe.log.inspect import segment_id

    layout = _load(config_path).config.layout
    directory = layout.archive / day.date().isoformat()
    if not directory.is_dir():
        raise EventpipeError(f"the archive has no day {directory.name}",
                             fix="`eventpipe status` shows the days it has")  # fmt: skip
    out = sys.stdout.buffer
    if event_id is None:
        for segment in segments_of_day(directory):
            for _, line in lines(segment):
                out.write(line)
        return
    found = 0
    for match in find(directory, event_id):
        found += 1
        click.echo(f"{segment_id(match.segment.segment_file)}:{match.line}", err=True)
        out.write(match.event + b"\n")
    if not found:
        raise EventpipeError(f"no event {event_id!r} in archive/{directory.name}")


@cli.group("log")
def log_group() -> None:
    """Look into the log: segments, events by position, progress per destination."""


@log_group.command("status")
@config_option
def log_status(config_path: Path | None) -> None:
    """Per destination x table: batches loaded, rows, failures; then what is pending."""
    from eventpipe.paths import count_lines
    from eventpipe.state.store import SENT_TABLE, open_state

    config = _load(config_path).config
    layout = config.layout
    store = open_state(config)
    sealed = layout.sealed_segments()
    rows = []
    for dest_id in config.destinations:
        for t in store.tables(dest_id):
            name = "(sent)" if t.table == SENT_TABLE else t.table
            rows.append((dest_id, name, f"{t.batches_ok:,}", f"{t.rows:,}",
                         f"{t.batches_failed:,}", t.last_update,
                         (t.last_error or "")[:60]))  # fmt: skip
        pending = _backlog(config, dest_id, store.summary(dest_id).done_segments, sealed)
        failed = layout.failed_destination(dest_id)
        events = count_lines(failed) if failed.exists() else 0
        rows.append((dest_id, "(pending)", "", "", "", "", pending))
        rows.append((dest_id, "(failed/)", "", "", "", "", f"{events:,} event(s) in {failed.name}"))
    _print_table(["destination", "table", "batches ok", "rows", "batches failed",
                  "last update (UTC)", "note"], rows)  # fmt: skip


@log_group.command("segments")
@config_option
def log_segments(config_path: Path | None) -> None:
    """The sealed segments on disk, in log order: where they are and their size."""
    from eventpipe.log.inspect import segments

    layout = _load(config_path).config.layout
    rows = [
        (s.id, "archive" if s.archived else "incoming", f"{s.path.stat().st_size:,}")
        for s in segments(layout)
    ]
    _print_table(["segment", "where", "bytes"], rows)


@log_group.command("show")
@config_option
@click.option("--from", "start", required=True, help="First position: SEGMENT[:LINE].")
@click.option("--to", "end", default=None, help="Last position (included); default: the end.")
@click.option("--limit", type=int, default=1000, show_default=True, help="Events at most.")
@click.option(
    "--destination", "destination_id", default=None,
    help="Show each event as this destination would receive it (table, flat columns).",
)  # fmt: skip
def log_show(
    config_path: Path | None, start: str, end: str | None, limit: int, destination_id: str | None
) -> None:
    """Print the events from one position to another, each after its position."""
    from itertools import islice

    from eventpipe.log.inspect import Position, read

    config = _load(config_path).config
    last = Position.parse(end) if end else None
    found = list(islice(read(config.layout, Position.parse(start), last), limit))
    if destination_id is None:
        for position, line in found:
            click.echo(f"{position}\t{line.decode('utf-8', errors='replace')}")
        return
    import orjson

    from eventpipe.processing.preview import preview
    from eventpipe.reserved import FILTERED

    config.destination(destination_id)
    lines = [line for _, line in found]
    previews = _with_spark(config, lambda spark: preview(config, spark, destination_id, lines))
    for (position, _), shown in zip(found, previews, strict=True):
        if shown.table == FILTERED:
            what = "filtered: by the destination's namespace or transforms"
        elif shown.table:
            what = f"table {shown.table}\t" + orjson.dumps(shown.columns, default=str).decode()
        elif shown.table == "":
            what = "skipped: the table name is empty"
        else:
            what = f"failed: {shown.error}"
        click.echo(f"{position}\t{what}")


@log_group.command("ack")
@config_option
@click.option("--destination", "destination_id", required=True, help="The destination id.")
@click.option("--to", "end", required=True, help="The last position handled: SEGMENT[:LINE].")
def log_ack(config_path: Path | None, destination_id: str, end: str) -> None:
    """Mark a destination's events up to a position (included) as handled, without
    loading them: the destination goes on after it."""
    from eventpipe.log.inspect import Position
    from eventpipe.processing.operator import acknowledge

    config = _load(config_path).config
    config.destination(destination_id)
    marked = acknowledge(config, destination_id, Position.parse(end))
    if not marked:
        click.echo(f"nothing to acknowledge: {destination_id} has handled it already")
    for what in marked:
        click.echo(f"acknowledged {destination_id} up to {what}")


@log_group.command("step")
@config_option
@click.option("--destination", "destination_id", required=True, help="The destination id.")
def log_step(config_path: Path | None, destination_id: str) -> None:
    """Process a destination's next pending event alone and print what happened."""
    from eventpipe.processing.operator import step
    from eventpipe.state.store import SENT_TABLE

    config = _load(config_path).config
    config.destination(destination_id)
    done = _with_spark(config, lambda spark: step(config, spark, destination_id))
    if done is None:
        click.echo(f"nothing pending for {destination_id}")
        return
    report = done.report
    click.echo(f"{done.position}\t{done.line.decode('utf-8', errors='replace')}")
    for (_, table), rows in sorted(report.loaded.items()):
        click.echo(f"  sent: {rows} event(s)" if table == SENT_TABLE else
                   f"  loaded into {table}: {rows} row(s)")  # fmt: skip
    if report.skipped.get(destination_id):
        click.echo("  skipped: the table name is empty")
    if report.filtered.get(destination_id):
        click.echo("  filtered: by the destination's namespace or transforms")
    if report.failed.get(destination_id):
        failed = config.layout.failed_destination(destination_id)
        error = _last_error(failed)
        click.echo(f"  failed: {error} (-> {failed})")
    if report.corrupt:
        click.echo("  failed: the line is not a JSON object (-> data/failed/)")
    if not (report.loaded or report.skipped.get(destination_id) or report.corrupt or
            report.failed.get(destination_id) or report.filtered.get(destination_id)):  # fmt: skip
        click.echo(f"  not for {destination_id} (its key is not in only_keys)")


def _last_error(failed: Path) -> str:
    import orjson

    with failed.open("rb") as lines:
        last = b""
        for last in lines:  # noqa: B007 (the last line is wanted)
            pass
    return str(orjson.loads(last).get("error")) if last else "?"


def _with_spark(config: Any, call: Callable[[Any], T]) -> T:
    """``call(spark)`` with a Spark session of the config's settings, stopped after."""
    from eventpipe.processing.spark import start_session

    spark = start_session(config.spark.settings)
    try:
        return call(spark)
    finally:
        spark.stop()


def _print_report(report: Any) -> None:
    state = "resumed" if report.resumed else "ran"
    click.echo(f"{state} {report.run_id} over {len(report.segments)} segment(s)")
    for (dest, table), rows in sorted(report.loaded.items()):
        click.echo(f"  {dest}.{table}: {rows} rows")
    for dest, count in sorted(report.skipped.items()):
        if count:
            click.echo(f"  {dest}: {count} event(s) skipped (empty table name)")
    for dest, count in sorted(report.filtered.items()):
        if count:
            click.echo(f"  {dest}: {count} event(s) filtered (namespace, transforms, or "
                       "metering's older versions of a key)")  # fmt: skip
    for dest, count in sorted(report.replaced.items()):
        if count:
            click.echo(f"  {dest}: {count} row(s) of earlier runs replaced by newer versions")
    for dest, count in sorted(report.failed.items()):
        if count:
            click.echo(f"  {dest}: {count} event(s) failed -> data/failed/failed.dst={dest}.log")
    if report.corrupt:
        click.echo(f"  {report.corrupt} unreadable line(s) -> data/failed/")
    click.echo(f"  archived {len(report.archived)} segment(s)")


@cli.command()
@config_option
@click.option("--history", is_flag=True, help="The last runs instead: what each loaded.")
@click.option("--limit", type=int, default=20, show_default=True, help="Runs --history shows.")
def status(config_path: Path | None, history: bool, limit: int) -> None:
    """Per destination: backlog (stream: lag), last load, rows loaded, failed and skipped
    events. With --history: the last runs, per destination: tables and rows, events
    skipped and failed, the code version the rows were built with."""
    from eventpipe.paths import count_lines
    from eventpipe.state.store import open_state

    config = _load(config_path).config
    if history:
        _print_history(open_state(config), limit)
        return
    layout = config.layout
    sealed = layout.sealed_segments()
    store = open_state(config)
    names = ["destination", "type", "backlog", "last load (UTC)", "rows loaded", "failed",
             "skipped", "filtered"]  # fmt: skip
    rows = []
    for dest_id, dest in config.destinations.items():
        summary = store.summary(dest_id)
        rows.append((
            dest_id, dest.type, _backlog(config, dest_id, summary.done_segments, sealed),
            summary.last_load or "never", f"{summary.rows_loaded:,}", f"{summary.failed:,}",
            f"{summary.skipped:,}", f"{summary.filtered:,}",
        ))  # fmt: skip
    _print_table(names, rows)
    active = sum(p.stat().st_size for p in layout.active_segments())
    click.echo(f"incoming: {len(sealed)} sealed segment(s), {active / 1e6:.1f} MB being written")
    click.echo(_archive_line(config))
    click.echo(f"state: {store.db.where}")
    received = sum(count_lines(p) for p in sorted(layout.failed.glob("failed.tok=*.log")))
    if received:
        click.echo(f"failed/failed.tok=*.log: {received:,} event(s) refused at the collector "
                   "or unreadable in the log (docs/log.md)")  # fmt: skip


def _print_history(store: Any, limit: int) -> None:
    from datetime import datetime

    rows = []
    for run in store.history(limit):
        took = ""
        if run.finished_at:
            seconds = datetime.fromisoformat(run.finished_at) - datetime.fromisoformat(
                run.started_at
            )
            took = f"{seconds.total_seconds():.1f}"
        counts = {d: (skipped, failed, filtered) for d, skipped, failed, filtered in run.events}
        destinations = sorted(
            set(run.code_versions) | {t.destination for t in run.tables} | set(counts)
        ) or [""]
        for dest in destinations:
            loaded = "; ".join(
                f"{t.table} {t.rows:,}" if t.status == "ok" else f"{t.table} failed: {t.error}"
                for t in run.tables
                if t.destination == dest
            )
            skipped, failed, filtered = counts.get(dest, (0, 0, 0))
            rows.append((
                run.run_id, run.started_at[:19].replace("T", " "), took, run.trigger,
                run.status, run.segments, dest, run.code_versions.get(dest, ""),
                loaded, f"{skipped:,}", f"{failed:,}", f"{filtered:,}",
            ))  # fmt: skip
    _print_table(["run", "started (UTC)", "seconds", "trigger", "status", "segments",
                  "destination", "code version", "loaded (table rows)", "skipped",
                  "failed", "filtered"], rows)  # fmt: skip


def _archive_line(config: Any) -> str:
    from eventpipe.archive.retention import usage

    held = usage(config.layout)
    days = held.days
    span = f" ({days[0]} to {days[-1]})" if days else ""
    ratio = (
        f" ({held.disk_bytes / held.raw_bytes:.0%} of {held.raw_bytes / 1e6:.1f} MB)"
        if held.raw_bytes
        else ""
    )
    kept = config.archive.retention_days
    bound = config.archive.max_bytes
    return (
        f"archive: {len(days)} day(s){span}, {held.files} file(s), {held.events:,} event(s), "
        f"{held.disk_bytes / 1e6:.1f} MB{ratio}; "
        f"{'kept forever' if kept is None else f'kept {kept} day(s)'}, "
        f"{'no size bound' if bound is None else f'at most {bound / 1e6:.1f} MB'}"
    )


def _backlog(config: Any, dest_id: str, done: frozenset[str], sealed: list[Path]) -> str:
    """What a destination has still to load: a stream's lag in events and time, or the
    sealed segments it has not finished (``done``: those it has)."""
    from eventpipe.log.tail import lag

    if config.destinations[dest_id].mode == "stream":  # the log read as it is written
        behind = lag(config.layout, dest_id)
        return f"stream: {behind.events:,} event(s), {behind.seconds:.0f} s behind"
    pending = [p for p in sealed if p.name not in done]
    size = sum(p.stat().st_size for p in pending)
    return f"{len(pending)} segment(s), {size / 1e6:.1f} MB"


@cli.command()
@config_option
@click.argument("sql")
@click.option(
    "--destination", "destination_id", default=None,
    help="A destination id (default: the first one).",
)  # fmt: skip
def query(config_path: Path | None, sql: str, destination_id: str | None) -> None:
    """Run one read-only query on a destination (DuckDB; PostgreSQL in its schema;
    Parquet tables as DuckDB views) and print a table. Writes, several statements and
    reading other files are refused."""
    from eventpipe.processing.run import open_destination

    config = _load(config_path).config
    candidates = dict(config.destinations)
    chosen = destination_id or next(iter(candidates), None)
    if chosen is None or chosen not in candidates:
        raise ConfigError(f"no destination {destination_id or ''} in the config".strip())
    dest = candidates[chosen]
    if dest.type == "http":
        raise ConfigError(f"{chosen} is an http sink: it has no tables to query",
                          fix="name a table destination with --destination")  # fmt: skip
    if dest.type == "duckdb":
        path = Path(dest.path) if dest.path else config.layout.warehouse
        if not path.exists():
            fix = (
                "events appear within seconds while `eventpipe run` (or `process`) is up"
                if dest.mode == "stream"
                else "run `eventpipe process --once`"
            )
            raise EventpipeError(f"{path} does not exist yet: nothing loaded so far", fix=fix)
    import duckdb
    import psycopg

    try:
        names, rows = open_destination(chosen, dest, config).query(sql)
    except QueryError as exc:  # refused, or the SQL as the database answers it
        raise EventpipeError(f"{chosen}: the query failed: {exc.message}") from None
    except (duckdb.Error, psycopg.Error) as exc:
        raise EventpipeError(f"{chosen}: the query failed: {exc}".strip()) from None
    _print_table(names, rows)


def _print_table(names: list[str], rows: list[tuple[Any, ...]]) -> None:
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(n), *(len(r[i]) for r in cells)]) for i, n in enumerate(names)]
    click.echo(" | ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)))
    click.echo("-+-".join("-" * w for w in widths))
    for row in cells:
        click.echo(" | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
    click.echo(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except EventpipeError as exc:
        click.echo(f"error: {exc.message}", err=True)
        if exc.fix:
            click.echo(f"  fix: {exc.fix}", err=True)
        sys.exit(2 if isinstance(exc, ConfigError) else 1)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
