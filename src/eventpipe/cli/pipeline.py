"""Commands of the pipeline: ``process``, ``replay failed``, ``reprocess``,
``spark-entry`` (the file ``spark-submit`` runs to launch any of them) and
``spark-archive`` (the JVM class-data archive that halves Spark's start)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from eventpipe.cli.common import (
    DAY,
    cli,
    config_option,
    idle_exit,
    idle_option,
    load,
    print_report,
    with_spark,
)
from eventpipe.errors import ConfigError, TerminalError


@cli.command()
@config_option
@click.option("--once", is_flag=True, help="Process what is sealed now, then exit (cron, Airflow).")
@click.option("--release-when-idle", is_flag=True, hidden=True,
              help="Exit with 4 after processing.release_idle_seconds with nothing to "
              "process (eventpipe run starts it again when a segment is sealed).")  # fmt: skip
@idle_option
def process(
    config_path: Path | None, once: bool, release_when_idle: bool, idle_exit_code: int
) -> None:
    """Run the Spark batch pipeline over sealed segments."""
    from eventpipe import service

    idled = False

    def idle() -> None:
        nonlocal idled
        idled = True
        click.echo("nothing to process: no sealed segment")

    released = service.process(load(config_path).config, once=once, report=print_report,
                               idle=idle, release_when_idle=release_when_idle)  # fmt: skip
    if once and idled:
        idle_exit(idle_exit_code)
    if released:
        raise SystemExit(service.RELEASED_EXIT)


@cli.command("spark-entry")
def spark_entry() -> None:
    """Print the Python file spark-submit runs to launch eventpipe's commands:
    spark-submit --master URL "$(eventpipe spark-entry)" process --once -c eventpipe.yaml"""
    # Named, not imported: importing it made the command group import itself back.
    click.echo(Path(__file__).with_name("__main__.py"))


@cli.command("spark-archive")
@click.option("--force", is_flag=True, help="Build it again even if it exists.")
def spark_archive(force: bool) -> None:
    """Build the JVM class-data archive that halves Spark's start on this machine (make
    run and make test do). A training run of sample events; about half a minute."""
    from eventpipe.processing.runtime import class_data

    path = class_data.archive_path()
    if path is None:
        from eventpipe.processing.runtime.spark import check_java

        check_java()  # raises, with how to install Java
        return
    if path.is_file() and not force:
        click.echo(f"up to date: {path}")
        return
    from eventpipe.processing.modes import training

    click.echo(f"building {path} (a training run of sample events) ...")
    training.build(path)
    click.echo(f"built {path} ({path.stat().st_size / 2**20:.0f} MB)")


@cli.group()
def replay() -> None:
    """Send events through the pipeline again."""


@replay.command("failed")
@config_option
@click.option("--destination", "destination_id", required=True, help="The destination id.")
@click.option("--reason", default=None, help="Only the records with this error (exactly).")
@click.option("--event-id", "event_ids", multiple=True,
              help="Only the records of this event id (repeatable).")  # fmt: skip
@idle_option
def replay_failed_command(
    config_path: Path | None,
    destination_id: str,
    reason: str | None,
    event_ids: tuple[str, ...],
    idle_exit_code: int,
) -> None:
    """Replay data/failed/failed.dst=ID.log (or only the records of --reason and
    --event-id): what loads leaves failed/ (archived), what fails again stays there with
    its new error."""
    from eventpipe.processing.modes.replay import Selection, replay_failed

    config = load(config_path).config
    config.destination(destination_id)
    selection = Selection(reason, frozenset(event_ids))
    report = with_spark(
        config, lambda spark: replay_failed(config, spark, destination_id, selection)
    )
    if report is None:
        chosen = " of that selection" if selection else ""
        click.echo(f"nothing to replay: no failed events{chosen} for {destination_id}")
        idle_exit(idle_exit_code)
    else:
        print_report(report)


@cli.command()
@config_option
@click.option(
    "--from",
    "first",
    type=DAY,
    required=True,
    help="First day (YYYY-MM-DD, UTC day of _timestamp).",
)
@click.option(
    "--to",
    "last",
    type=DAY,
    default=None,
    help="Last day, included (default: --from).",
)
@click.option(
    "--destination",
    "destination_ids",
    multiple=True,
    help="Only this destination (repeatable; default: every duckdb, postgres, iceberg, "
    "delta and local parquet one without metering).",
)
@click.option("--force", is_flag=True, help="Rebuild every day of the range, up to date or not.")
@click.option("--dry-run", is_flag=True, help="Print what would be rebuilt and why.")
@idle_option
def reprocess(
    config_path: Path | None,
    first: Any,
    last: Any,
    destination_ids: tuple[str, ...],
    force: bool,
    dry_run: bool,
    idle_exit_code: int,
) -> None:
    """Rebuild days from the raw archive: each day (by _timestamp) whose rows were built
    with another code version, or whose archive files changed (every day with --force),
    has its rows replaced in one transaction. Interrupted, it resumes where it stopped."""
    import signal

    from eventpipe.processing.modes import reprocess as rp
    from eventpipe.processing.runtime import shutdown
    from eventpipe.processing.runtime.pipeline import Runtime

    config = load(config_path).config
    start, end = first.date(), (last or first).date()
    if end < start:
        raise ConfigError(f"--to {end} is before --from {start}")
    targets = list(destination_ids) or rp.batch_ids(config)
    if not targets:
        raise ConfigError(
            "no duckdb, postgres, iceberg, delta or local parquet destination to reprocess"
        )
    for dest_id in targets:
        rp.replaceable(config, dest_id)
    runtime = Runtime(config)  # planned without Spark; the session comes with the runs
    plans = {d: rp.plan(runtime, d, start, end, force) for d in targets}
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
        with_session = Runtime(config, spark, state=runtime.state)
        for dest_id in targets:
            todo, results = rp.run_reprocess(with_session, dest_id, start, end, force=force,
                                             progress=click.echo)  # fmt: skip
            summary(dest_id, todo, results)

    if any(todo.groups for todo in plans.values()):
        with_spark(config, run)
    else:  # nothing to rebuild: no Spark session (15 s) for nothing
        for dest_id, todo in plans.items():
            summary(dest_id, todo, [])
    if refused:
        raise TerminalError(f"{refused} day(s) could not be rebuilt (listed above)")
    if not any(todo.groups for todo in plans.values()):
        idle_exit(idle_exit_code)


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
