"""``eventpipe status`` (and ``--history``) and ``eventpipe query``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import click

from eventpipe.cli.common import backlog, cli, config_option, load, print_table
from eventpipe.destinations.base import Destination
from eventpipe.destinations.registry import kind
from eventpipe.errors import ConfigError, EventpipeError, QueryError


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

    config = load(config_path).config
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
            dest_id, dest.type, backlog(config, dest_id, summary.done_segments, sealed),
            summary.last_load or "never", f"{summary.rows_loaded:,}", f"{summary.failed:,}",
            f"{summary.skipped:,}", f"{summary.filtered:,}",
        ))  # fmt: skip
    print_table(names, rows)
    active = sum(p.stat().st_size for p in layout.active_segments())
    click.echo(f"incoming: {len(sealed)} sealed segment(s), {active / 1e6:.1f} MB being written")
    _print_writers(config)
    click.echo(_archive_line(config))
    click.echo(f"state: {store.db.where}")
    received = sum(count_lines(p) for p in sorted(layout.failed.glob("failed.tok=*.log")))
    if received:
        click.echo(f"failed/failed.tok=*.log: {received:,} event(s) refused at the collector "
                   "or unreadable in the log (docs/log.md)")  # fmt: skip


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
            ))  # fmt: skip
    print_table(["run", "started (UTC)", "seconds", "trigger", "status", "segments",
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
                else "run `eventpipe process --once`"
            )
            raise EventpipeError(f"{path} does not exist yet: nothing loaded so far", fix=fix)
    import duckdb
    import psycopg

    try:
        names, rows = cast(Destination, open_destination(chosen, dest, config)).query(sql)
    except QueryError as exc:  # refused, or the SQL as the database answers it
        raise EventpipeError(f"{chosen}: the query failed: {exc.message}") from None
    except (duckdb.Error, psycopg.Error) as exc:
        raise EventpipeError(f"{chosen}: the query failed: {exc}".strip()) from None
    print_table(names, rows)
