"""``eventpipe read``: a source's copy and changes into the log."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import click

from eventpipe.cli.common import cli, config_option, load


@cli.command("read")
@config_option
@click.argument("source_id")
@click.option("--once", is_flag=True, help="Stop when the source has no new change.")
def read(config_path: Path | None, source_id: str, once: bool) -> None:
    """Copy a source's tables into the log (once), then follow their changes until
    Ctrl-C or SIGTERM (docs/cdc.md). Killed at any point, it resumes without losing a
    change."""
    from eventpipe.sources.postgres import PostgresSource

    config = load(config_path).config
    source = PostgresSource(config, source_id)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    report = source.read(once=once, stop=stopping.is_set)
    for table, rows in sorted(report.copied.items()):
        click.echo(f"copied {table}: {rows} rows")
    click.echo(f"{report.changes} change(s) in {report.transactions} transaction(s) logged")
