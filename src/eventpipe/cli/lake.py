"""``eventpipe lake``: maintenance of Iceberg and Delta tables (``compact``, ``expire``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import click

from eventpipe.cli.common import cli, config_option, load
from eventpipe.errors import ConfigError
from eventpipe.reserved import SHADOW_PREFIX

if TYPE_CHECKING:
    from eventpipe.destinations.lakehouse import LakehouseDestination

LAKE_TYPES = ("iceberg", "delta")


@cli.group("lake")
def lake_group() -> None:
    """Maintenance of Iceberg and Delta destinations: compact small files, expire old
    versions."""


def _tables_of(
    config_path: Path | None, destination_id: str | None, tables: tuple[str, ...]
) -> tuple[LakehouseDestination, list[str]]:
    from eventpipe.destinations.lakehouse import LakehouseDestination
    from eventpipe.processing.runtime.pipeline import Runtime

    config = load(config_path).config
    lakes = [d for d, dest in config.destinations.items() if dest.type in LAKE_TYPES]
    if destination_id is None and len(lakes) == 1:
        destination_id = lakes[0]
    if destination_id not in lakes:
        known = ", ".join(lakes) or "none"
        raise ConfigError(
            f"no iceberg or delta destination {destination_id or ''} (configured: {known})"
            .replace("  ", " "),
            fix="name one with --destination",
        )  # fmt: skip
    assert destination_id is not None
    opened = Runtime(config).open_destination(destination_id)
    assert isinstance(opened, LakehouseDestination)
    present = [t for t in opened.tables() if not t.startswith(SHADOW_PREFIX)]
    missing = sorted(set(tables) - set(present))
    if missing:
        raise ConfigError(f"{destination_id} has no table {', '.join(missing)}")
    return opened, list(tables) or present


_destination = click.option(
    "--destination", "destination_id", default=None,
    help="An iceberg or delta destination (default: the only one).",
)  # fmt: skip
_table = click.option(
    "--table", "tables", multiple=True, help="Only this table (repeatable; default: all)."
)


@lake_group.command("compact")
@config_option
@_destination
@_table
def lake_compact(
    config_path: Path | None, destination_id: str | None, tables: tuple[str, ...]
) -> None:
    """Rewrite each table's small files (one per batch and day) into fewer, a day
    partition at a time, in one commit per table. Readers see the same rows throughout."""
    lake, names = _tables_of(config_path, destination_id, tables)
    for table in names:
        before, after = lake.compact(table)
        click.echo(f"{lake.id}.{table}: {before} data file(s) -> {after}")


@lake_group.command("expire")
@config_option
@_destination
@_table
@click.option(
    "--older-than", "days", type=click.IntRange(min=1), default=7, show_default=True,
    help="Days of versions to keep (time travel, and the record of recent batches).",
)  # fmt: skip
def lake_expire(
    config_path: Path | None, destination_id: str | None, tables: tuple[str, ...], days: int
) -> None:
    """Forget table versions older than --older-than days (the current one is always
    kept) and delete the data files that no version kept names and that are that old
    (those of replaced rows, compacted files, commits that failed)."""
    lake, names = _tables_of(config_path, destination_id, tables)
    before = datetime.now(UTC) - timedelta(days=days)
    for table in names:
        versions, files = lake.expire(table, before)
        click.echo(f"{lake.id}.{table}: {versions} version(s) expired, {files} file(s) deleted")
