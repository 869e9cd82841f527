"""An event checked against its tracking plan: which plan is for it (by ``event_type``,
then its key and ``src``, then the version), and what it breaks, each violation as the
JSON pointer of the value, the rule (the schema keyword) and the validator's message."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from eventpipe.contracts.plans import Plan, compiled, compiled_many
from eventpipe.reserved import CHECKED

MAX_VIOLATIONS = 10
"""Violations of one event recorded at most (the rest are counted)."""
MAX_ERRORS = 1000
"""Violations of one event looked at at most: past them, not counted either."""
MAX_CHOICES = 10_000
"""Event type, key and source combinations whose plans are remembered (src is the
client's text: it could take any number of values)."""
MAX_MESSAGE = 200
"""A violation's message at most, in characters (a message quotes the value)."""
EVENT_TYPE = "event_type"


class Violation(NamedTuple):
    """(A tuple: made for every violation of every event the job checks.)"""

    pointer: str
    """Where in the event, as a JSON pointer (``""``: the event itself)."""
    rule: str
    """The schema keyword that failed (``required``, ``type``, ``pattern``...)."""
    message: str

    def __str__(self) -> str:
        return f"{self.pointer or '/'} {self.rule}: {self.message}"


@dataclass(frozen=True)
class Verdict:
    """An event's check: the plan it was checked against and what it broke."""

    plan: str
    """The plan's id (``$id``, or ``<event_type>/<version>``)."""
    violations: tuple[Violation, ...]
    more: int = 0
    """Violations past :data:`MAX_VIOLATIONS`, counted only."""
    rules: tuple[str, ...] = ()
    """The rules broken, each once, of every violation looked at (those past
    :data:`MAX_VIOLATIONS` too)."""
    pointers: tuple[str, ...] = ()
    """Where the values that broke a rule are (JSON pointers, each once, of every
    violation looked at; not the event itself): what ``discard_value`` drops."""

    @classmethod
    def of(cls, plan: str, found: Iterable[Violation]) -> Verdict:
        """The verdict of ``found`` violations (at most :data:`MAX_VIOLATIONS` listed, in
        the order of their places and rules)."""
        ordered = sorted(found)
        if len(ordered) == 1:  # the usual case, for less work per event
            (only,) = ordered
            return cls(plan, (only,), 0, (only.rule,), (only.pointer,) if only.pointer else ())
        return cls(plan, tuple(ordered[:MAX_VIOLATIONS]), max(0, len(ordered) - MAX_VIOLATIONS),
                   tuple(sorted({v.rule for v in ordered})),
                   tuple(sorted({v.pointer for v in ordered if v.pointer})))  # fmt: skip

    def listed(self) -> list[str]:
        """Each violation as text, and how many more there were (if any)."""
        texts = [str(v) for v in self.violations]
        if self.more:
            texts.append(f"and {self.more} more")
        return texts

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        """One line: the plan and each violation (as the job's :func:`summary` makes it
        from :meth:`listed`)."""
        return f"contract {self.plan}: {'; '.join(self.listed())}"


MARK_FORMAT = 1
"""The version of what a mark holds and of how verdicts are written (change it with
either: marks made before are then checked again)."""


def plans_digest(plans: Iterable[Plan], version_field: str | None) -> str:
    """What a list of plans checks, in 16 hex digits: the same for the same plans in the
    same order (their ids, versions, selectors and schemas, whatever their files),
    version field and validator, and different as soon as any of them differs. A line's
    mark (:meth:`Contracts.mark`) names it, so that the job trusts only a verdict made
    under the plans, and by the validator, it runs with. (64 bits tell plans apart; what
    keeps a client from forging a mark is the collector dropping any mark it sends.)"""
    from importlib.metadata import version

    described = [[p.id, p.version, p.event_type, sorted(p.keys or ()), sorted(p.sources or ()),
                  p.schema] for p in plans]  # fmt: skip
    whole = orjson.dumps([MARK_FORMAT, version("jsonschema-rs"), version_field, described],
                         option=orjson.OPT_SORT_KEYS)  # fmt: skip
    return hashlib.sha256(whole).hexdigest()[:16]


class Contracts:
    """The tracking plans, ready to check events (:meth:`check`) and to mark the lines of
    the events they checked (:meth:`mark`)."""

    def __init__(self, plans: Iterable[Plan], version_field: str | None = None) -> None:
        plans = list(plans)
        self.version_field = version_field
        self.digest = plans_digest(plans, version_field)
        self._by_type: dict[str, list[_Checked]] = {}
        self._ok_marks: dict[str, dict[str, Any]] = {}
        for plan in sorted(plans, key=lambda p: -p.version):
            checked = _Checked(plan, compiled(plan.path, plan.schema), Verdict(plan.id, ()),
                               compiled_many(plan.path, plan.schema))  # fmt: skip
            self._by_type.setdefault(plan.event_type, []).append(checked)
            self._ok_marks[plan.id] = {"plans": self.digest, "plan": plan.id}
        self._no_plan_mark = {"plans": self.digest}
        self.ok_marks = {
            plan: orjson.Fragment(orjson.dumps(m)) for plan, m in self._ok_marks.items()
        }
        """:meth:`mark_json` of an event that met its plan, by the plan's id."""
        self._no_plan_json = orjson.Fragment(orjson.dumps(self._no_plan_mark))
        self._chosen: dict[tuple[str, Any, Any], list[_Checked]] = {}
        """The plans for an event type, key and source, newest first (made once each:
        this runs for every event on the collector's event loop)."""
        self._for_any: dict[str, list[_Checked]] = {
            event_type: mine for event_type, mine in self._by_type.items()
            if all(c.plan.keys is None and c.plan.sources is None for c in mine)
        }  # fmt: skip
        """The plans of the event types whose plans are for every key and source: no
        choice to make per event."""
        self._backoff: dict[_Checked, list[int]] = {}
        """Per plan whose events broke it lately: the calls of check_many left that
        check its events one by one, and how many that was at first."""

    def __bool__(self) -> bool:
        return bool(self._by_type)

    def mark(self, event: Mapping[str, Any], verdict: Verdict | None) -> dict[str, Any] | None:
        """What the line of ``event``, checked to ``verdict``, ends with as its last
        top-level key, :data:`CHECKED` (the collector writes it there): these plans'
        digest and the verdict, so that the job can take the verdict instead of checking
        the line again. None for an event of a type no plan is for (the job does not
        check those either). (Marks of events that met their plan are made once: never
        change one.)"""
        if verdict is None:
            event_type = event.get(EVENT_TYPE)
            planned = type(event_type) is str and event_type in self._by_type
            return self._no_plan_mark if planned else None
        if verdict.ok:
            return self._ok_marks[verdict.plan]
        # The violations as the JSON text the job's verdict holds (Spark would write a
        # JSON array back otherwise: characters past the BMP as \u escapes).
        listed = orjson.dumps(verdict.listed()).decode()
        return {"plans": self.digest, "plan": verdict.plan, "violations": listed,
                "rules": verdict.rules, "pointers": verdict.pointers}  # fmt: skip

    def mark_json(self, event: Mapping[str, Any], verdict: Verdict | None) -> Any:
        """:meth:`mark` as JSON that orjson writes as it is (an ``orjson.Fragment``), made
        once per plan for the events that met it; None where :meth:`mark` is None."""
        if verdict is not None and verdict.ok:
            return self.ok_marks[verdict.plan]
        mark = self.mark(event, verdict)
        if mark is None:
            return None
        return (
            self._no_plan_json
            if mark is self._no_plan_mark
            else orjson.Fragment(orjson.dumps(mark))
        )

    def check(self, event: Mapping[str, Any]) -> Verdict | None:
        """``event`` against the plan for it; None when no plan is for it."""
        chosen = self._choose(event)
        if chosen is None or isinstance(chosen, Verdict):
            return chosen
        return _verdict(chosen, event)

    def check_many(self, events: Sequence[Mapping[str, Any]]) -> list[Verdict | None]:
        """Each of ``events`` checked (the verdicts :meth:`check` gives, in order), the
        events of one plan together: the validator answers for :data:`RUN` of them at
        once whether all meet the plan (one call into Rust instead of one an event:
        0.6 us an event instead of 0.9, bench/ingest.py's events); from the first run
        where some do not, the rest of that plan's events are checked one by one, and so
        are its events of the next calls, for longer each time its runs fail (events
        that break their plan often would otherwise be checked twice)."""
        verdicts: list[Verdict | None] = [None] * len(events)
        runs: dict[_Checked, list[int]] = {}
        for_any, choose = self._for_any, self._choose
        pinned = self.version_field is not None
        for n, event in enumerate(events):
            event_type = event.get(EVENT_TYPE)
            mine = for_any.get(event_type) if type(event_type) is str else None
            if mine is None or pinned:
                chosen = choose(event)
                if chosen is None:
                    continue
                if isinstance(chosen, Verdict):
                    verdicts[n] = chosen
                    continue
            else:
                chosen = mine[0]
            places = runs.get(chosen)
            if places is None:
                runs[chosen] = [n]
            else:
                places.append(n)
        for chosen, places in runs.items():
            backoff = self._backoff.get(chosen)
            if backoff is not None and backoff[0] > 0:  # its events broke it lately
                backoff[0] -= 1
                start = 0
            else:
                start = self._runs(chosen, events, places, verdicts)
            for n in places[start:]:
                verdicts[n] = _verdict(chosen, events[n])
        return verdicts

    def _runs(
        self,
        chosen: _Checked,
        events: Sequence[Mapping[str, Any]],
        places: list[int],
        verdicts: list[Verdict | None],
    ) -> int:
        """The events of ``chosen`` at ``places`` asked about in runs: each run that all
        meet it gets their verdicts. Where the events left are (from the first run that
        does not; ``len(places)`` if none), to be checked one by one. A plan whose run
        fails is not asked about in runs for the next 1, 2, 4... calls (up to
        :data:`MAX_BACKOFF`), until one of its runs all meet it again."""
        for start in range(0, len(places), RUN):
            part = places[start : start + RUN]
            try:
                all_ok = chosen.all_valid([events[n] for n in part])
            except (TypeError, ValueError):  # a value JSON has not: told one by one
                all_ok = False
            if not all_ok:
                last = self._backoff.get(chosen, (0, 0))[1]
                wait = min(MAX_BACKOFF, 2 * last or 1)
                self._backoff[chosen] = [wait, wait]
                return start
            for n in part:
                verdicts[n] = chosen.ok
        self._backoff.pop(chosen, None)
        return len(places)

    def _choose(self, event: Mapping[str, Any]) -> _Checked | Verdict | None:
        """The plan ``event`` is to be checked against; None when no plan is for it, its
        verdict where the version it asks for is not one of its plans'."""
        event_type = event.get(EVENT_TYPE)
        if type(event_type) is not str:
            return None
        mine = self._for_any.get(event_type)
        if mine is None:
            mine = self._chosen_for(event, event_type)
            if not mine:
                return None
        chosen = mine[0]
        if self.version_field is not None and self.version_field in event:
            wanted = event[self.version_field]
            pinned = [c for c in mine if c.plan.version == wanted]
            if not pinned:
                known = ", ".join(str(c.plan.version) for c in mine)
                return Verdict.of(chosen.plan.id, (Violation(
                    _pointer((self.version_field,)), "version",
                    f"no version {_short(repr(wanted))} of the plan for {event_type!r} "
                    f"(there are {known})"),))  # fmt: skip
            chosen = pinned[0]
        return chosen

    def _chosen_for(self, event: Mapping[str, Any], event_type: str) -> list[_Checked]:
        """The plans for ``event`` of ``event_type`` where some plan of its type is for
        some keys or sources only, newest first ([] where none is for it)."""
        if event_type not in self._by_type:
            return []
        key, source = event.get("api_key"), event.get("src")
        choice = (event_type, key if type(key) is str else None,
                  source if type(source) is str else None)  # fmt: skip
        mine = self._chosen.get(choice)
        if mine is None:
            mine = [c for c in self._by_type[event_type] if c.plan.is_for(choice[1], choice[2])]
            if len(self._chosen) < MAX_CHOICES:
                self._chosen[choice] = mine
        return mine


def unmarked(event: dict[str, Any]) -> dict[str, Any]:
    """``event`` (changed in place) as the collector checked it: without what the check
    adds to its line (the mark, ``eventn_ctx.contract`` and ``contract_violations``), so
    that a check of the line gives the verdict its mark carries, and a plan that allows
    no other keys does not call the check's own fields wrong."""
    event.pop(CHECKED, None)
    context = event.get("eventn_ctx")
    if type(context) is dict and ("contract" in context or "contract_violations" in context):
        context.pop("contract", None)
        context.pop("contract_violations", None)
    return event


MAX_BACKOFF = 32
"""Calls of :meth:`Contracts.check_many` at most in which a plan whose events broke it
is not asked about in runs."""
RUN = 32
"""Events of one plan the validator is asked about at once (:meth:`Contracts.check_many`):
where one of them breaks the plan, they are checked again one by one, so a run is short."""


@dataclass(frozen=True, eq=False)  # told apart by identity: a key of check_many's runs
class _Checked:
    plan: Plan
    validator: Any
    ok: Verdict
    """The verdict of an event that meets the plan (one object for all of them)."""
    many: Any
    """The validator of a JSON array of events that all meet the plan (None: none)."""

    def all_valid(self, events: list[Any]) -> bool:
        return self.many is not None and bool(self.many.is_valid(events))


def _verdict(chosen: _Checked, event: Mapping[str, Any]) -> Verdict:
    """``event`` against the plan ``chosen`` for it."""
    try:
        if chosen.validator.is_valid(event):
            return chosen.ok
        errors = list(itertools.islice(chosen.validator.iter_errors(event), MAX_ERRORS))
    except (TypeError, ValueError) as exc:  # a value JSON has not (never from a body)
        return Verdict.of(chosen.plan.id, (Violation("", "unchecked", _short(str(exc))),))
    return Verdict.of(chosen.plan.id, (
        Violation(_pointer(e.instance_path), _rule(e.schema_path), _short(e.message))
        for e in errors
    ))  # fmt: skip


def _pointer(path: Sequence[Any]) -> str:
    """The JSON pointer of a path of keys and indexes (RFC 6901: ``~`` and ``/`` escaped)."""
    if not path:
        return ""
    keys = [p if type(p) is str else str(p) for p in path]
    if any("~" in k or "/" in k for k in keys):
        keys = [k.replace("~", "~0").replace("/", "~1") for k in keys]
    return "/" + "/".join(keys)


def _rule(schema_path: Sequence[Any]) -> str:
    return str(schema_path[-1]) if schema_path else "schema"


def _short(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 1] + "…"
