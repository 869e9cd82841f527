"""Events that arrived checked against tracking plans before the plans are switched on
(``eventpipe contract check``): how many each plan would check and refuse, and which
rules at which places, with a few examples each."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson

from eventpipe.contracts.check import Contracts, unmarked

EXAMPLES = 3
"""Example events kept for each rule broken at each place."""


@dataclass
class Replayed:
    """What checking some events against the plans found."""

    events: int = 0
    unplanned: int = 0
    """Events no plan is for."""
    unreadable: int = 0
    """Lines that are not JSON objects."""
    checked: Counter[str] = field(default_factory=Counter)
    """Events checked, by plan."""
    broken: Counter[str] = field(default_factory=Counter)
    """Events that would be refused (or flagged), by plan."""
    rules: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    """Violations by plan, place (JSON pointer) and rule."""
    examples: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)
    """For each of :attr:`rules`, the first events' ids and messages."""

    def add(self, line: bytes, contracts: Contracts) -> None:
        self.events += 1
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            self.unreadable += 1
            return
        if not isinstance(event, dict):
            self.unreadable += 1
            return
        verdict = contracts.check(unmarked(event))
        if verdict is None:
            self.unplanned += 1
            return
        self.checked[verdict.plan] += 1
        if verdict.ok:
            return
        self.broken[verdict.plan] += 1
        context = event.get("eventn_ctx")
        event_id = context.get("event_id") if isinstance(context, dict) else None
        for violation in verdict.violations:
            where = (verdict.plan, violation.pointer or "/", violation.rule)
            self.rules[where] += 1
            kept = self.examples.setdefault(where, [])
            if len(kept) < EXAMPLES:
                kept.append(f"{event_id or '(no id)'}: {violation.message}")

    @property
    def ok(self) -> bool:
        return not self.broken

    def lines(self) -> list[str]:
        """The report, line by line."""
        out = [f"{self.events:,} event(s): {sum(self.checked.values()):,} checked, "
               f"{sum(self.broken.values()):,} would break their plan, {self.unplanned:,} "
               f"with no plan, {self.unreadable:,} not JSON objects"]  # fmt: skip
        for plan, checked in sorted(self.checked.items()):
            broken = self.broken.get(plan, 0)
            out.append(f"plan {plan}: {checked:,} checked, {broken:,} would break "
                       f"({broken / checked:.1%})")  # fmt: skip
            for (of, pointer, rule), count in self.rules.most_common():
                if of != plan:
                    continue
                out.append(f"  {pointer} {rule}: {count:,} event(s)")
                out.extend(f"    e.g. {example}" for example in self.examples[(of, pointer, rule)])
        return out


def replayed(lines: Iterable[bytes], contracts: Contracts) -> Replayed:
    found = Replayed()
    for line in lines:
        found.add(line, contracts)
    return found
