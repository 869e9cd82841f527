"""``eventpipe contract``: ``infer`` (draft tracking plans from the archive) and ``check``
(archived days against plans, before they are switched on)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import click

from eventpipe.cli.common import DAY, cli, config_option, load
from eventpipe.errors import ConfigError, EventpipeError, TerminalError


@cli.group("contract")
def contract_group() -> None:
    """Tracking plans: draft them from what arrived, check what arrived against them."""


@contract_group.command("infer")
@config_option
@click.option("--from", "first", type=DAY, required=True, help="First day (YYYY-MM-DD).")
@click.option("--to", "last", type=DAY, required=True, help="Last day (included).")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False),
              default=Path("plans"), show_default=True,
              help="Where the drafts are written, one file per type.")  # fmt: skip
@click.option("--force", is_flag=True, help="Replace drafts already in --out.")
def contract_infer(config_path: Path | None, first: Any, last: Any, out: Path,
                   force: bool) -> None:  # fmt: skip
    """Write a draft tracking plan (JSON Schema) per event type from the archived events
    of the days: each field's types, the fields every event had as required, enums for
    text fields with few values. Edit them, then name them in contracts.plans."""
    import orjson

    from eventpipe.contracts.infer import drafts_of, file_name

    config = load(config_path).config
    drafts = drafts_of(_events(config, first.date(), last.date()))
    if not drafts.shapes:
        raise EventpipeError(
            f"no event with an event_type in the archive from {first:%Y-%m-%d} to "
            f"{last:%Y-%m-%d} ({drafts.skipped:,} line(s) without one)",
            fix="`eventpipe status` shows the days the archive has",
        )
    out.mkdir(parents=True, exist_ok=True)
    taken: set[str] = set()
    plans = drafts.plans(f"from {first:%Y-%m-%d} to {last:%Y-%m-%d}")
    names = {event_type: file_name(event_type, taken) for event_type in plans}
    existing = [n for n in names.values() if (out / n).exists()]
    if existing and not force:
        raise ConfigError(f"{out} already has {', '.join(existing[:3])}",
                          fix="edit those, choose another --out, or pass --force")  # fmt: skip
    for event_type, plan in plans.items():
        (out / names[event_type]).write_bytes(orjson.dumps(plan, option=orjson.OPT_INDENT_2))
        click.echo(f"{out / names[event_type]}: {event_type}")
    click.echo(f"{len(plans)} draft(s) from {drafts.events:,} event(s); "
               f"{drafts.skipped:,} line(s) without an event_type skipped")  # fmt: skip


@contract_group.command("check")
@config_option
@click.argument("plans", nargs=-1, required=True,
                type=click.Path(path_type=Path, exists=True))  # fmt: skip
@click.option("--from", "first", type=DAY, required=True, help="First day (YYYY-MM-DD).")
@click.option("--to", "last", type=DAY, required=True, help="Last day (included).")
def contract_check(config_path: Path | None, plans: tuple[Path, ...], first: Any,
                   last: Any) -> None:  # fmt: skip
    """Check the archived events of the days against PLANS (files or directories), as
    the collector would with them switched on: per plan, how many events it checks and
    would refuse, and which rules break where, with examples. Exits 65 if any event
    would break its plan."""
    from eventpipe.contracts.check import Contracts
    from eventpipe.contracts.plans import PlanError, read_plans
    from eventpipe.contracts.replay import replayed

    config = load(config_path).config
    try:
        contracts = Contracts(read_plans(plans), config.contracts.version_field)
    except PlanError as exc:
        raise ConfigError(f"tracking plan {exc}") from None
    found = replayed(_lines(config, first.date(), last.date()), contracts)
    if not found.events:
        raise EventpipeError(
            f"the archive has no event from {first:%Y-%m-%d} to {last:%Y-%m-%d}",
            fix="`eventpipe status` shows the days the archive has",
        )
    for line in found.lines():
        click.echo(line)
    if not found.ok:
        broken = sum(found.broken.values())
        raise TerminalError(f"{broken:,} archived event(s) would break their plan",
                            fix="fix the plans or the senders, then check again")  # fmt: skip


def _days(first: date, last: date) -> Iterator[date]:
    day = first
    while day <= last:
        yield day
        day += timedelta(days=1)


def _lines(config: Any, first: date, last: date) -> Iterator[bytes]:
    """The archived lines of the days, in log order (a day on archive.remote that the
    disk lacks is restored first, as ``archive cat`` does)."""
    from eventpipe.archive.files import segments_of_day
    from eventpipe.archive.read import lines
    from eventpipe.archive.remote import remote_of

    if last < first:
        raise ConfigError("--to is before --from")
    layout = config.layout
    remote = remote_of(config.archive)
    if remote is not None:
        remote.restore(layout, first, last)
    for day in _days(first, last):
        directory = layout.archive / day.isoformat()
        if directory.is_dir():
            for segment in segments_of_day(directory):
                for _, line in lines(segment):
                    yield line


def _events(config: Any, first: date, last: date) -> Iterator[Any]:
    import orjson

    for line in _lines(config, first, last):
        try:
            yield orjson.loads(line)
        except orjson.JSONDecodeError:
            yield None
