"""``eventpipe log``: ``status``, ``segments``, ``show``, ``ack``, ``step``,
``compact``, ``fill``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from eventpipe.cli.common import (
    cli,
    config_option,
    idle_exit,
    idle_option,
    last_error,
    load,
    print_table,
    with_spark,
)
from eventpipe.figures import backlog, failed_events


@cli.group("log")
def log_group() -> None:
    """Look into the log: segments, events by position, progress per destination."""


@log_group.command("status")
@config_option
def log_status(config_path: Path | None) -> None:
    """Per destination x table: batches loaded, rows, failures; then what is pending."""
    from eventpipe.state.store import SENT_TABLE, open_state

    config = load(config_path).config
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
        pending = backlog(config, dest_id, store.summary(dest_id).done_segments, sealed)
        failed = layout.failed_destination(dest_id)
        events = failed_events(failed)  # as status counts
        rows.append((dest_id, "(pending)", "", "", "", "", pending))
        rows.append((dest_id, "(failed/)", "", "", "", "", f"{events:,} event(s) in {failed.name}"))
    print_table(["destination", "table", "batches ok", "rows", "batches failed",
                  "last update (UTC)", "note"], rows)  # fmt: skip


@log_group.command("segments")
@config_option
def log_segments(config_path: Path | None) -> None:
    """The sealed segments on disk, in log order: where they are and their size (a
    source's compacted segment says so)."""
    from eventpipe.archive.files import ArchivedSegment
    from eventpipe.log.compaction import is_compacted
    from eventpipe.log.inspect import segments

    layout = load(config_path).config.layout
    rows = [
        (s.id, "archive" if s.archived else "incoming", f"{s.path.stat().st_size:,}",
         "compacted" if s.archived and is_compacted(ArchivedSegment(s.path)) else "")
        for s in segments(layout)
    ]  # fmt: skip
    print_table(["segment", "where", "bytes", "note"], rows)


@log_group.command("compact")
@config_option
@click.argument("source_ids", nargs=-1)
def log_compact(config_path: Path | None, source_ids: tuple[str, ...]) -> None:
    """Compact sources' archived segments now (all sources without SOURCE_IDS): each
    key's newest change remains (docs/cdc.md). The pipeline also does it by itself when
    a source's archive grows past its compaction_bytes."""
    from eventpipe.log.compaction import compact

    config = load(config_path).config
    for source_id in source_ids or tuple(config.sources):
        done = compact(config, source_id)
        if done is None:
            click.echo(f"{source_id}: nothing to compact")
        else:
            click.echo(f"{source_id}: {done.segments} segment(s) -> {done.segment}: "
                       f"{done.events_out:,} of {done.events_in:,} events kept, "
                       f"{done.bytes_in:,} -> {done.bytes_out:,} bytes")  # fmt: skip


@log_group.command("fill")
@config_option
@click.option("--destination", "destination_id", required=True, help="The destination to fill.")
@idle_option
def log_fill(config_path: Path | None, destination_id: str, idle_exit_code: int) -> None:
    """Load a destination added later with the archived segments of its keys, in log
    order (after a source's compaction: its current state, then what followed); then
    the pipeline goes on with it as usual. Run it before the pipeline runs the
    destination."""
    from eventpipe.processing.modes.fill import fill

    config = load(config_path).config
    reports = with_spark(config, lambda spark: fill(spark, config, destination_id, click.echo))
    if not reports:
        click.echo(f"{destination_id}: no archived segment to fill it with")
        idle_exit(idle_exit_code)


@log_group.command("show")
@config_option
@click.option("--from", "start", default=None, help="First position: SEGMENT[:LINE].")
@click.option("--to", "end", default=None, help="Last position (included); default: the end.")
@click.option(
    "--stdin", "from_stdin", is_flag=True,
    help="The events are JSON lines on standard input (stored events, as the log holds "
    "them), shown as stdin:N, instead of --from/--to.",
)  # fmt: skip
@click.option("--limit", type=int, default=1000, show_default=True, help="Events at most.")
@click.option(
    "--destination", "destination_id", default=None,
    help="Show each event as this destination would receive it (table, flat columns).",
)  # fmt: skip
def log_show(
    config_path: Path | None,
    start: str | None,
    end: str | None,
    from_stdin: bool,
    limit: int,
    destination_id: str | None,
) -> None:
    """Print the events from one position to another (or given on standard input), each
    after its position."""
    from itertools import islice

    from eventpipe.log.inspect import Position, read

    config = load(config_path).config
    if from_stdin == (start is not None):
        raise click.UsageError("give --from (a position of the log) or --stdin, not both")
    if from_stdin:
        given = (line.rstrip(b"\r\n") for line in sys.stdin.buffer if line.strip())
        found: list[tuple[object, bytes]] = [
            (f"stdin:{n}", line) for n, line in enumerate(islice(given, limit))
        ]
        if not found:
            click.echo("no events on standard input", err=True)
            return
    else:
        assert start is not None
        last = Position.parse(end) if end else None
        first = Position.parse(start)
        found = list(islice(read(config.layout, first, last), limit))
        if not found:  # say so: an empty answer looked like a log without events
            click.echo(f"no events from {first}{f' to {last}' if last else ''} (a position "
                       "past the end of its segment, or of the log? eventpipe log segments "
                       "lists them)", err=True)  # fmt: skip
            return
    if destination_id is None:
        for position, line in found:
            click.echo(f"{position}\t{line.decode('utf-8', errors='replace')}")
        return
    import orjson

    from eventpipe.processing.modes.preview import preview
    from eventpipe.reserved import FILTERED

    config.destination(destination_id)
    lines = [line for _, line in found]
    previews = with_spark(config, lambda spark: preview(config, spark, destination_id, lines))
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
    from eventpipe.processing.modes.log_steps import acknowledge

    config = load(config_path).config
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
    from eventpipe.processing.modes.log_steps import step
    from eventpipe.state.store import SENT_TABLE

    config = load(config_path).config
    config.destination(destination_id)
    done = with_spark(config, lambda spark: step(config, spark, destination_id))
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
        error = last_error(failed)
        click.echo(f"  failed: {error} (-> {failed})")
    if report.corrupt:
        click.echo("  failed: the line is not a JSON object (-> data/failed/)")
    if not (report.loaded or report.skipped.get(destination_id) or report.corrupt or
            report.failed.get(destination_id) or report.filtered.get(destination_id)):  # fmt: skip
        click.echo(f"  not for {destination_id} (its key is not in only_keys)")
