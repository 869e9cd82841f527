"""``eventpipe status`` (and ``--history``) and ``eventpipe query``."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import click

from eventpipe.cli.common import (
    cli,
    config_option,
    load,
    print_table,
)
from eventpipe.config import TableDestinationConfig
from eventpipe.destinations.base import Destination
from eventpipe.destinations.registry import kind
from eventpipe.errors import ConfigError, EventpipeError, QueryError
from eventpipe.figures import backlog, failed_events, failed_records


@cli.command()
@config_option
@click.option("--history", is_flag=True, help="The last runs instead: what each loaded.")
@click.option("--limit", type=int, default=20, show_default=True, help="Runs --history shows.")
@click.option("--watch", is_flag=True,
              help="Redraw until Ctrl-C: per destination events/s loaded (with a sparkline "
                   "of the last minute), backlog and lag; and events/s coming in.")  # fmt: skip
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              help="Seconds between --watch's redraws.")  # fmt: skip
@click.option("--count", type=int, default=None, hidden=True, help="Redraws, then stop.")
def status(
    config_path: Path | None, history: bool, limit: int, watch: bool, interval: float,
    count: int | None,
) -> None:  # fmt: skip
    """Per destination: backlog (stream: lag), last load, events loaded, failed and skipped
    events. With --history: the last runs, per destination: tables and rows, events
    skipped and failed, the code version the rows were built with. With --watch: live."""
    from eventpipe.paths import count_lines
    from eventpipe.state.store import open_state

    config = load(config_path).config
    if history:
        _print_history(open_state(config), limit)
        return
    if watch:
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how it ends
            _watch(config, interval, count)
        return
    layout = config.layout
    sealed = layout.sealed_segments()
    store = open_state(config)
    names = ["destination", "type", "backlog", "last load (UTC)", "events loaded", "failed",
             "skipped", "filtered"]  # fmt: skip
    rows = []
    unsealed = sum(count_lines(p) for p in layout.active_segments())
    for dest_id, dest in config.destinations.items():
        summary = store.summary(dest_id)
        # What its failed/ file holds now: a replay takes events out (the runs' count
        # of failures said 4 where the file held 2).
        failed = failed_events(layout.failed_destination(dest_id))
        rows.append((
            dest_id, dest.type,
            backlog(config, dest_id, summary.done_segments, sealed, unsealed),
            summary.last_load or "never", f"{summary.rows_loaded:,}", f"{failed:,}",
            f"{summary.skipped:,}", f"{summary.filtered:,}",
        ))  # fmt: skip
    print_table(names, rows)
    for dest_id in config.destinations:
        for table, error in store.failing_tables(dest_id):
            click.echo(f"{dest_id}: table {table} failing, its events go to failed/: {error}")
    for dest_id in config.destinations:
        found = store.contract_counts(dest_id)
        for each in found[:MAX_CONTRACT_LINES]:
            click.echo(f"{dest_id}: {each} event(s) (contracts, docs/contracts.md)")
        if len(found) > MAX_CONTRACT_LINES:
            click.echo(f"{dest_id}: and {len(found) - MAX_CONTRACT_LINES} more contract "
                       "count(s) (status --history shows each run's)")  # fmt: skip
    active = sum(p.stat().st_size for p in layout.active_segments())
    click.echo(f"incoming: {len(sealed)} sealed segment(s), {active / 1e6:.1f} MB being written")
    _print_writers(config)
    _print_sources(config)
    click.echo(_archive_line(config))
    click.echo(f"state: {store.db.where}")
    received, damaged = failed_records(sorted(layout.failed.glob("failed.tok=*.log")))
    if received:
        click.echo(f"failed/failed.tok=*.log: {received:,} event(s) refused at the collector "
                   "or unreadable in the log (docs/log.md)")  # fmt: skip
    if damaged:
        click.echo(f"failed/failed.tok=*.log: {damaged:,} damaged line(s), cut short by a "
                   "crash mid-write (kept as they are)")  # fmt: skip


MAX_CONTRACT_LINES = 20
"""Lines of contract counts ``status`` shows per destination at most."""

SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float]) -> str:
    """``values`` as bars from ▁ (zero) to █ (the largest)."""
    top = max(values, default=0.0)
    if top <= 0:
        return SPARKS[0] * len(values)
    return "".join(SPARKS[min(7, int(v / top * 7 + 0.5))] for v in values)


def _watch(config: Any, interval: float, count: int | None) -> None:
    """``status --watch``: redrawn every ``interval`` seconds (``count`` times, or until
    Ctrl-C); on a terminal the screen is cleared first, otherwise each redraw follows.
    The figures are eventpipe.figures', as the console's."""
    import sys
    import time
    from collections import deque

    from eventpipe.figures import Watch
    from eventpipe.state.store import open_state

    watch = Watch(config, open_state(config))
    width = max(2, int(60 / interval))  # about a minute of history
    history: dict[str, deque[float]] = {d: deque(maxlen=width) for d in config.destinations}
    terminal = sys.stdout.isatty()
    drawn = 0
    while count is None or drawn < count:
        sample = watch.sample()
        rows = []
        for dest in sample.destinations:
            history[dest.id].append(dest.rate)
            lag = "-" if dest.lag_seconds is None else f"{dest.lag_seconds:,.0f} s"
            rows.append((dest.id, f"{dest.rate:,.0f}", sparkline(history[dest.id]),
                         dest.backlog, lag, dest.last_load or "never"))  # fmt: skip
        if terminal:
            click.clear()
        at = sample.at.replace("T", " ").removesuffix("+00:00")
        click.echo(f"eventpipe status --watch, {at} UTC (Ctrl-C stops)")
        print_table(["destination", "events/s", "last minute", "backlog", "lag",
                     "last load (UTC)"], rows)  # fmt: skip
        if sample.incoming_bytes_per_second is not None:
            speed = sample.incoming_bytes_per_second / 1e6
            click.echo(f"incoming: {speed:.2f} MB/s written to the log")
        drawn += 1
        if count is None or drawn < count:
            time.sleep(interval)


def _print_sources(config: Any) -> None:
    """Per source, per table: copy or sync, the rows copied; the changes logged since."""
    if not config.sources:
        return
    from eventpipe.sources.postgres import PostgresSource

    rows = []
    for source_id in config.sources:
        progress = PostgresSource(config, source_id).progress()
        if progress.start is None:
            rows.append((source_id, "(not read yet)", "", "", ""))
            continue
        confirmed = progress.confirmed or progress.start
        rows.append((source_id, "(changes)", "sync" if progress.copied else "copy",
                     f"{progress.changes:,}", f"slot {progress.slot} at {confirmed}"))  # fmt: skip
        for namespace, table in sorted(progress.tables.items()):
            rows.append((source_id, namespace, table["state"], f"{table['rows']:,}", ""))
    print_table(["source", "table", "state", "rows", "position"], rows)


def _print_writers(config: Any) -> None:
    """The log's writers: which are alive, their last heartbeat, what they write now."""
    from eventpipe.log import writers
    from eventpipe.paths import SegmentName

    layout = config.layout
    writing: dict[str | None, int] = {}
    for path in layout.active_segments():
        parsed = SegmentName.parse(path.name)
        writer = parsed.writer if parsed else None
        writing[writer] = writing.get(writer, 0) + path.stat().st_size
    found = writers.states(layout, config.incoming.writer_timeout_seconds)
    if not found:
        return
    rows = [
        (w.id, "alive" if w.alive else "gone", w.host or "?", str(w.pid or "?"),
         f"{w.heartbeat_age:.0f} s ago", f"{writing.get(w.id, 0) / 1e6:.1f} MB")
        for w in found
    ]  # fmt: skip
    print_table(["writer", "state", "host", "pid", "heartbeat", "being written"], rows)


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
                "; ".join(str(c) for c in run.contracts if c.destination == dest),
            ))  # fmt: skip
    print_table(["run", "started (UTC)", "seconds", "trigger", "status", "segments",
                  "destination", "code version", "loaded (table events)", "skipped",
                  "failed", "filtered", "contracts"], rows)  # fmt: skip


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
    copy = ""
    if config.archive.remote is not None:
        from eventpipe.archive.remote import pending

        waiting = pending(config.layout)
        copy = (f"; copied to {config.archive.remote}"
                + (f" ({len(waiting)} day(s) waiting to upload)" if waiting else ""))  # fmt: skip
    return (
        f"archive: {len(days)} day(s){span}, {held.files} file(s), {held.events:,} event(s), "
        f"{held.disk_bytes / 1e6:.1f} MB{ratio}; "
        f"{'kept forever' if kept is None else f'kept {kept} day(s)'}, "
        f"{'no size bound' if bound is None else f'at most {bound / 1e6:.1f} MB'}{copy}"
    )


@cli.command()
@config_option
@click.argument("sql")
@click.option(
    "--destination", "destination_id", default=None,
    help="A destination id (default: the first one).",
)  # fmt: skip
def query(config_path: Path | None, sql: str, destination_id: str | None) -> None:
    """Run one read-only query on a destination (DuckDB; PostgreSQL in its schema;
    ClickHouse in its database; Snowflake in its schema; Parquet, Iceberg and Delta
    tables through DuckDB) and
    print a table. Writes, several statements and reading other files are refused."""
    from eventpipe.processing.runtime.pipeline import Runtime

    config = load(config_path).config
    candidates = dict(config.destinations)
    chosen = destination_id or next(iter(candidates), None)
    if chosen is None or chosen not in candidates:
        raise ConfigError(f"no destination {destination_id or ''} in the config".strip())
    dest = candidates[chosen]
    found = kind(dest)
    if not found.tables:
        raise ConfigError(f"{chosen} is an {dest.type} sink: it has no tables to query",
                          fix="name a table destination with --destination")  # fmt: skip
    if found.file is not None:
        path = found.file(dest, config)
        if not path.exists():
            fix = (
                "events appear within seconds while `eventpipe run` (or `process`) is up"
                if dest.mode == "stream"
                else "events are loaded once their segment is sealed (every "
                "incoming.rotate_seconds): `eventpipe rotate` seals now, then `eventpipe "
                "process --once` loads them"
            )
            raise EventpipeError(f"{path} does not exist yet: nothing loaded so far", fix=fix)
    import duckdb
    import psycopg

    try:
        opened = cast(Destination, Runtime(config).open_destination(chosen))
        timeout = cast(TableDestinationConfig, dest).query_timeout_seconds
        names, rows = opened.query(sql, timeout_seconds=timeout)
    except QueryError as exc:  # refused, or the SQL as the database answers it
        raise EventpipeError(f"{chosen}: the query failed: {exc.message}") from None
    except (duckdb.Error, psycopg.Error) as exc:
        raise EventpipeError(f"{chosen}: the query failed: {exc}".strip()) from None
    print_table(names, rows)
