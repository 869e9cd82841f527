"""What every command shares: the ``eventpipe`` group, ``-c/--config``, loading the
config, a Spark session for a call, and how reports and tables are printed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from eventpipe import __version__
from eventpipe.config import DEFAULT_CONFIG_PATH, LoadedConfig, load_config
from eventpipe.logsetup import configure_logging

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


def config_path_of(config_path: Path | None) -> Path | None:
    """The config file a command uses: its own ``-c``, else the one given before the
    command (``eventpipe -c prod.yaml status``), else ``EVENTPIPE_CONFIG``, else None
    (``./eventpipe.yaml`` if it exists, built-in defaults if not)."""
    if config_path is not None:
        return config_path
    context = click.get_current_context(silent=True)
    root = context.find_root() if context is not None else None
    given = root.params.get("config_path") if root is not None else None
    return Path(given) if given else None


def load(config_path: Path | None) -> LoadedConfig:
    loaded = load_config(config_path_of(config_path))
    configure_logging(loaded.config.logging)
    return loaded


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="eventpipe")
@click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    envvar="EVENTPIPE_CONFIG",
    show_envvar=True,
    help="Config file for any command (also after the command's name).",
)
def cli(config_path: Path | None) -> None:
    """eventpipe: collect events over HTTP, keep them durably, load them into warehouses."""


DAY = click.DateTime(["%Y-%m-%d"])


def last_error(failed: Path) -> str:
    import orjson

    with failed.open("rb") as lines:
        last = b""
        for last in lines:  # noqa: B007 (the last line is wanted)
            pass
    return str(orjson.loads(last).get("error")) if last else "?"


def with_spark(config: Any, call: Callable[[Any], T]) -> T:
    """``call(spark)`` with a Spark session of the config's settings, stopped after."""
    from eventpipe.processing.runtime.spark import on_terminal, start_session

    spark = start_session(on_terminal(config.spark.settings), jvm_log=config.layout.spark_log)
    try:
        return call(spark)
    finally:
        spark.stop()


def print_report(report: Any) -> None:
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
    for (dest, table, what), count in sorted(report.held.items()):
        click.echo(f"  {dest}.{table}: {count} event(s) held back by its schema contract "
                   f"({what})")  # fmt: skip
    if report.corrupt:
        click.echo(f"  {report.corrupt} unreadable line(s) -> data/failed/")
    click.echo(f"  archived {len(report.archived)} segment(s)")


def print_table(names: list[str], rows: list[tuple[Any, ...]]) -> None:
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(n), *(len(r[i]) for r in cells)]) for i, n in enumerate(names)]
    click.echo(" | ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)))
    click.echo("-+-".join("-" * w for w in widths))
    for row in cells:
        click.echo(" | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
    click.echo(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")


def idle_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--idle-exit-code``: what a command exits with when it had nothing to do."""
    return click.option(
        "--idle-exit-code", type=click.IntRange(0, 255), default=0, show_default=True,
        help="Exit with this code when there was nothing to do (99: what Airflow's "
        "BashOperator takes as skipped; docs/orchestration.md).",
    )(command)  # fmt: skip


def idle_exit(code: int) -> None:
    """End the command with ``code`` (given by --idle-exit-code): it had nothing to do."""
    if code:
        raise click.exceptions.Exit(code)
