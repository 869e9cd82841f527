"""``eventpipe archive``: ``verify``, ``cat`` and ``restore``."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click

from eventpipe.cli.common import DAY, cli, config_option, load
from eventpipe.errors import ConfigError, EventpipeError, TerminalError


@cli.group("archive")
def archive_group() -> None:
    """The raw archive of processed segments: verify its checksums, read events back."""


@archive_group.command("verify")
@config_option
@click.option("--from", "first", type=DAY, default=None, help="First day (YYYY-MM-DD).")
@click.option("--to", "last", type=DAY, default=None, help="Last day (included).")
@click.option("--remote", is_flag=True,
              help="Verify the copy on archive.remote instead (each day downloaded to a "
              "temporary directory), and that every segment on disk is there.")  # fmt: skip
def archive_verify(config_path: Path | None, first: Any, last: Any, remote: bool) -> None:
    """Recompute every size and checksum of the archive (all days, or --from/--to) and
    name each file and frame that does not match. Exits 65 (a data error) if one does
    not."""
    from eventpipe.archive.verify import verify, verify_remote

    config = load(config_path).config
    first_day, last_day = (first.date() if first else None), (last.date() if last else None)
    if remote:
        report = verify_remote(config.layout, _remote(config), first_day, last_day)
    else:
        report = verify(
            config.layout, first_day, last_day,
            progress=lambda path: logging.getLogger("eventpipe.archive").debug("verify %s", path),
        )  # fmt: skip
    for problem in report.problems:
        click.echo(f"MISMATCH {problem}")
    summary = (
        f"{report.days} day(s), {report.files} file(s), {report.frames:,} frame(s), "
        f"{report.events:,} event(s), {report.compressed_bytes / 1e6:.1f} MB"
    )
    if report.problems:
        raise TerminalError(
            f"{len(report.problems)} problem(s) in {summary}",
            fix="a damaged file can be archived again from a copy of its segment, or "
            "deleted with its sidecars; docs/archive.md",
        )
    click.echo(f"ok: {summary}")


@archive_group.command("cat")
@config_option
@click.option("--day", required=True, type=DAY, help="The archive day (YYYY-MM-DD).")
@click.option("--event-id", default=None, help="Only the event(s) with this eventn_ctx.event_id.")
def archive_cat(config_path: Path | None, day: Any, event_id: str | None) -> None:
    """Print a day's archived events, in log order, one JSON per line; with --event-id,
    only that event (one frame is read), its position on stderr."""
    from eventpipe.archive.files import segments_of_day
    from eventpipe.archive.read import find, lines
    from eventpipe.log.inspect import segment_id

    config = load(config_path).config
    layout = config.layout
    directory = layout.archive / day.date().isoformat()
    if config.archive.remote is not None:  # the disk may lack some of the day's segments
        _remote(config).restore(layout, day.date(), day.date())
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


@archive_group.command("restore")
@config_option
@click.option("--from", "first", type=DAY, default=None, help="First day (YYYY-MM-DD).")
@click.option("--to", "last", type=DAY, default=None, help="Last day (included).")
def archive_restore(config_path: Path | None, first: Any, last: Any) -> None:
    """Bring back from archive.remote the segments of the days (all, or --from/--to)
    that the disk lacks (after max_bytes deleted them, or a lost disk), each checked
    against its manifest before it takes its place. Exits 65 if one does not match."""
    from eventpipe.archive.files import ArchiveFormatError

    config = load(config_path).config
    try:
        restored = _remote(config).restore(
            config.layout, first.date() if first else None, last.date() if last else None
        )
    except ArchiveFormatError as exc:
        raise TerminalError(str(exc), fix="`eventpipe archive verify --remote` names every "
                            "damaged file; docs/archive.md") from None  # fmt: skip
    for name in restored:
        click.echo(f"restored {name}")
    click.echo(f"{len(restored)} segment(s) restored from {config.archive.remote}")


def _remote(config: Any) -> Any:
    from eventpipe.archive.remote import remote_of

    remote = remote_of(config.archive)
    if remote is None:
        raise ConfigError(
            "archive.remote is not set: the archive is on this disk only",
            fix="set archive.remote: s3://bucket/prefix (docs/archive.md)",
        )
    return remote
