"""Draft tracking plans from events that arrived (``eventpipe contract infer``): per event
type, a JSON Schema of what its events held: each field's types, the fields every event
had as ``required``, an ``enum`` for text fields with few distinct values, array items
merged. A draft to edit and commit, not a contract: it says what came, not what should.

Bounded whatever the events are: at most :data:`MAX_FIELDS` fields an object and
:data:`MAX_DEPTH` levels are drafted (past them a note says so), and at most
:data:`MAX_TYPES` event types.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from eventpipe.contracts.check import unmarked

DRAFT = "https://json-schema.org/draft/2020-12/schema"
MAX_FIELDS = 500
"""Fields of one object drafted at most (an event type with random keys: the rest are
left open)."""
MAX_DEPTH = 16
MAX_TYPES = 1000
"""Event types drafted at most."""
ENUM_MAX = 10
"""A text field with at most this many distinct values becomes an ``enum``..."""
ENUM_SEEN = 5
"""... when each value came this many times on average (so that ten ids seen once each
are not taken for a closed list)."""
_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string",
               type(None): "null", dict: "object", list: "array"}  # fmt: skip


@dataclass
class _Shape:
    """What the values at one place of an event type's events were."""

    seen: int = 0
    types: set[str] = field(default_factory=set)
    texts: dict[str, int] | None = field(default_factory=dict)
    """Distinct text values and how often each came (None: too many to be an enum)."""
    fields: dict[str, _Shape] = field(default_factory=dict)
    present: dict[str, int] = field(default_factory=dict)
    """How many of the objects here had each field."""
    objects: int = 0
    items: _Shape | None = None
    cut: bool = False
    """Fields past MAX_FIELDS (or levels past MAX_DEPTH) were left out."""

    def add(self, value: Any, depth: int) -> None:
        self.seen += 1
        kind = _JSON_TYPES.get(type(value), "string")
        self.types.add(kind)
        if kind == "string" and self.texts is not None:
            self.texts[value] = self.texts.get(value, 0) + 1
            if len(self.texts) > ENUM_MAX:
                self.texts = None
        if depth >= MAX_DEPTH and kind in ("object", "array"):
            self.cut = True
            return
        if kind == "object":
            self.objects += 1
            for name, inner in value.items():
                shape = self.fields.get(name)
                if shape is None:
                    if len(self.fields) >= MAX_FIELDS:
                        self.cut = True
                        continue
                    shape = self.fields[name] = _Shape()
                self.present[name] = self.present.get(name, 0) + 1
                shape.add(inner, depth + 1)
        elif kind == "array":
            if self.items is None:
                self.items = _Shape()
            for inner in value:
                self.items.add(inner, depth + 1)

    def schema(self) -> dict[str, Any]:
        types = set(self.types)
        if {"integer", "number"} <= types:
            types.discard("integer")
        out: dict[str, Any] = {"type": sorted(types)[0] if len(types) == 1 else sorted(types)}
        texts = self.texts
        if (types == {"string"} and texts and len(texts) <= ENUM_MAX
                and self.seen >= ENUM_SEEN * len(texts)):  # fmt: skip
            out["enum"] = sorted(texts)
        if "object" in types:
            fields = sorted(self.fields.items())
            out["properties"] = {name: shape.schema() for name, shape in fields}
            required = sorted(n for n, count in self.present.items() if count == self.objects)
            if required:
                out["required"] = required
        if "array" in types and self.items is not None and self.items.seen:
            out["items"] = self.items.schema()
        if self.cut:
            out["$comment"] = (f"drafted up to {MAX_FIELDS} fields and {MAX_DEPTH} levels; "
                               "the rest were left open")  # fmt: skip
        return out


@dataclass
class Drafts:
    """Draft plans of the events given to :meth:`add`, by event type."""

    shapes: dict[str, _Shape] = field(default_factory=dict)
    events: int = 0
    skipped: int = 0
    """Lines that were not JSON objects with a text ``event_type``, or of types past
    MAX_TYPES."""

    def add(self, event: Any) -> None:
        event_type = event.get("event_type") if isinstance(event, dict) else None
        if not isinstance(event_type, str) or not event_type:
            self.skipped += 1
            return
        shape = self.shapes.get(event_type)
        if shape is None:
            if len(self.shapes) >= MAX_TYPES:
                self.skipped += 1
                return
            shape = self.shapes[event_type] = _Shape()
        self.events += 1
        shape.add(unmarked(event), 0)

    def plans(self, described: str) -> dict[str, dict[str, Any]]:
        """A draft plan per event type (``described``: where its events came from)."""
        out = {}
        for event_type, shape in sorted(self.shapes.items()):
            schema = shape.schema()
            out[event_type] = {
                "$schema": DRAFT,
                "x-eventpipe": {"event_type": event_type, "version": 1},
                "description": f"Drafted by eventpipe contract infer from {shape.seen:,} "
                f"event(s) {described}: edit it before you commit it.",
                **schema,
            }
        return out


def drafts_of(events: Iterable[Any]) -> Drafts:
    drafts = Drafts()
    for event in events:
        drafts.add(event)
    return drafts


def file_name(event_type: str, taken: set[str]) -> str:
    """A file name for an event type's plan: safe whatever the type's text (no path, no
    dot first), distinct from ``taken`` (added to it)."""
    base = re.sub(r"[^A-Za-z0-9_-]", "_", event_type)[:100].strip("_") or "event"
    name, n = f"{base}.json", 1
    while name in taken:
        n += 1
        name = f"{base}-{n}.json"
    taken.add(name)
    return name
