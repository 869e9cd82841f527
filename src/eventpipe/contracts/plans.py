"""Tracking plans: one JSON Schema (draft 2020-12) per event type and version, read from
files or directories of them (``.json``, ``.yaml``, ``.yml``), each saying what it is for
under the key ``x-eventpipe``::

    {"$schema": "https://json-schema.org/draft/2020-12/schema",
     "$id": "https://plans.example.com/page_view/2",
     "x-eventpipe": {"event_type": "page_view", "version": 2, "keys": ["web"]},
     "type": "object", "required": ["url"], "properties": {"url": {"type": "string"}}}

``event_type`` is required; ``version`` (an integer, 1 if absent), ``keys`` (api key ids)
and ``sources`` (values of the event's ``src``) are optional, narrowing which events the
plan is for. Versions of one plan live side by side: an event is checked against the
newest version for it, or the one its ``version_field`` names.

A plan is refused before anything runs, with the file and the reason, when it could hurt
the process that checks events: larger than :data:`MAX_PLAN_BYTES`; not a valid JSON
Schema; a ``$ref`` to anything outside the file (plans are read offline: nothing is ever
fetched); ``$ref`` chains that come back to where they started without looking into the
event (a check that would never end); two plans for the same events and version.
Patterns run on a regex engine with a backtracking limit, so no pattern runs for long.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

MAX_PLAN_BYTES = 1024 * 1024
"""A plan file's size at most."""
MAX_PLANS = 10_000
"""Plan files at most."""
SUFFIXES = (".json", ".yaml", ".yml")
SELECTOR = "x-eventpipe"
"""The key of a plan's top level that says which events it is for."""
_IN_PLACE = ("allOf", "anyOf", "oneOf")
"""Keywords whose subschemas apply to the same value (a ``$ref`` cycle through them
never moves into the event)."""
_IN_PLACE_ONE = ("not", "if", "then", "else", "$ref", "$dynamicRef")


class PlanError(ValueError):
    """A tracking plan that cannot be used: its file and why."""


@dataclass(frozen=True)
class Plan:
    """One tracking plan: which events it is for, and its schema."""

    event_type: str
    version: int
    id: str
    """Its ``$id``, or ``<event_type>/<version>``: what an event checked against it
    records."""
    path: Path
    schema: dict[str, Any] = field(repr=False, compare=False)
    keys: frozenset[str] | None = None
    sources: frozenset[str] | None = None

    def is_for(self, key: str | None, source: str | None) -> bool:
        return (self.keys is None or key in self.keys) and (
            self.sources is None or source in self.sources
        )


def read_plans(paths: Iterable[Path]) -> list[Plan]:
    """Every plan of ``paths`` (files, or directories read recursively), each checked:
    PlanError for the first that cannot be used."""
    plans: list[Plan] = []
    seen: dict[tuple[Any, ...], Path] = {}
    for path in _plan_files(paths):
        plan = read_plan(path)
        selector = (plan.event_type, plan.version, plan.keys, plan.sources)
        if selector in seen:
            raise PlanError(
                f"{path}: version {plan.version} of the plan for {plan.event_type!r} is "
                f"also in {seen[selector]} (for the same keys and sources): keep one"
            )
        seen[selector] = path
        plans.append(plan)
    return plans


def _plan_files(paths: Iterable[Path]) -> Iterator[Path]:
    count = 0
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
        elif path.is_file():
            found = [path]
        else:
            raise PlanError(f"{path}: no such file or directory of tracking plans")
        for file in found:
            count += 1
            if count > MAX_PLANS:
                raise PlanError(f"more than {MAX_PLANS} tracking plans: merge some")
            yield file


def read_plan(path: Path) -> Plan:
    """The plan in ``path``, checked (module docstring): PlanError says why not."""
    size = path.stat().st_size
    if size > MAX_PLAN_BYTES:
        raise PlanError(f"{path}: {size:,} bytes; a tracking plan may have "
                        f"{MAX_PLAN_BYTES:,} at most")  # fmt: skip
    schema = _parsed(path, path.read_bytes())
    if not isinstance(schema, dict):
        raise PlanError(f"{path}: a tracking plan is a JSON Schema object, not "
                        f"{type(schema).__name__}")  # fmt: skip
    event_type, version, keys, sources = _selector(path, schema.get(SELECTOR))
    _check_refs(path, schema)
    compiled(path, schema)
    plan_id = schema.get("$id")
    return Plan(
        event_type=event_type,
        version=version,
        id=plan_id if isinstance(plan_id, str) and plan_id else f"{event_type}/{version}",
        path=path,
        schema=schema,
        keys=keys,
        sources=sources,
    )


def _parsed(path: Path, data: bytes) -> Any:
    if path.suffix == ".json":
        import orjson

        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise PlanError(f"{path}: not JSON: {exc}") from None
    import yaml

    from eventpipe.yamlfiles import load_yaml

    try:
        return load_yaml(data, str(path))
    except yaml.YAMLError as exc:
        raise PlanError(f"{path}: not YAML: {exc}".splitlines()[0]) from None


def _selector(
    path: Path, selector: Any
) -> tuple[str, int, frozenset[str] | None, frozenset[str] | None]:
    where = f"{path}: {SELECTOR}"
    if not isinstance(selector, dict):
        raise PlanError(f'{path}: a tracking plan says which events it is for: add '
                        f'"{SELECTOR}": {{"event_type": "..."}} at its top')  # fmt: skip
    unknown = set(selector) - {"event_type", "version", "keys", "sources"}
    if unknown:
        raise PlanError(f"{where} has {', '.join(sorted(unknown))}: it takes event_type, "
                        "version, keys and sources")  # fmt: skip
    event_type = selector.get("event_type")
    if not isinstance(event_type, str) or not event_type:
        raise PlanError(f"{where}.event_type must be the event type's name")
    version = selector.get("version", 1)
    if type(version) is not int or version < 1:
        raise PlanError(f"{where}.version must be a whole number from 1")

    def names(name: str) -> frozenset[str] | None:
        value = selector.get(name)
        if value is None:
            return None
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(v, str) and v for v in value)
        ):
            raise PlanError(f"{where}.{name} must be a list of names")
        return frozenset(value)

    return event_type, version, names("keys"), names("sources")


def _check_refs(path: Path, schema: dict[str, Any]) -> None:
    """Every ``$ref`` inside the plan, and no cycle of references that never moves into
    the event."""
    anchors = dict(_anchors(schema))

    def target(ref: Any, at: str) -> str:
        if not isinstance(ref, str):
            raise PlanError(f"{path}: {at}: $ref must be text")
        if not ref.startswith("#"):
            own = schema.get("$id")
            if not (isinstance(own, str) and own and ref.startswith(own + "#")):
                raise PlanError(
                    f"{path}: {at}: $ref {ref!r} is outside this plan; plans are read "
                    "offline and nothing is fetched: put it under $defs and refer to it "
                    "as #/$defs/..."
                )
            ref = ref[len(own) :]
        fragment = unquote(ref[1:])
        if fragment and not fragment.startswith("/"):  # an anchor
            if fragment not in anchors:
                raise PlanError(f"{path}: {at}: $ref {ref!r}: no $anchor {fragment!r} here")
            return anchors[fragment]
        if _resolve(schema, fragment) is None:
            raise PlanError(f"{path}: {at}: $ref {ref!r} points to nothing in this plan")
        return fragment

    edges: dict[str, list[str]] = {}
    for pointer, node in subschemas(schema, ""):
        out = edges.setdefault(pointer, [])
        for keyword in ("$ref", "$dynamicRef"):
            if keyword in node:
                out.append(target(node[keyword], pointer or "/"))
        for keyword in _IN_PLACE:
            if isinstance(node.get(keyword), list):
                out.extend(f"{pointer}/{keyword}/{i}" for i in range(len(node[keyword])))
        for keyword in _IN_PLACE_ONE[:4]:
            if isinstance(node.get(keyword), dict):
                out.append(f"{pointer}/{keyword}")
    _no_cycle(path, edges)


def _no_cycle(path: Path, edges: dict[str, list[str]]) -> None:
    """No path of in-place edges leads back to where it started."""
    state: dict[str, int] = {}  # 1: being walked, 2: done
    for start in edges:
        if state.get(start):
            continue
        stack: list[tuple[str, Iterator[str]]] = [(start, iter(edges.get(start, ())))]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
            elif state.get(child) == 1:
                raise PlanError(
                    f"{path}: {child or '/'} refers back to itself through $ref without "
                    "looking into the event: checking an event would never end"
                )
            elif not state.get(child):
                state[child] = 1
                stack.append((child, iter(edges.get(child, ()))))


def subschemas(node: Any, pointer: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object under ``node`` with its JSON pointer (schemas and the rest alike:
    a pointer ``$ref`` may name any of them)."""
    if isinstance(node, dict):
        yield pointer, node
        for key, value in node.items():
            escaped = str(key).replace("~", "~0").replace("/", "~1")
            yield from subschemas(value, f"{pointer}/{escaped}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from subschemas(value, f"{pointer}/{i}")


def _anchors(schema: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for pointer, node in subschemas(schema, ""):
        for keyword in ("$anchor", "$dynamicAnchor"):
            if isinstance(node.get(keyword), str):
                yield node[keyword], pointer


def _resolve(schema: Any, pointer: str) -> Any:
    node = schema
    for part in pointer.split("/")[1:] if pointer else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


_compiled: dict[bytes, Any] = {}
"""Validators by their schema's content (plans are read again at every run: a stream's
micro-batch each second must not compile, nor keep, a validator each time)."""
_compiled_lock = threading.Lock()
MAX_COMPILED = 1000


def compiled(path: Path, schema: dict[str, Any]) -> Any:
    """The plan's validator (jsonschema-rs, offline, formats checked), made once per
    schema: PlanError for a schema that is not valid JSON Schema."""
    import jsonschema_rs

    def make() -> Any:
        try:
            jsonschema_rs.meta.validate(schema)
            return jsonschema_rs.validator_for(schema, validate_formats=True, offline=True)
        except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError) as exc:
            first = str(exc).splitlines()[0]
            raise PlanError(f"{path}: not a valid JSON Schema: {first}") from None

    return _made(b"one", path, schema, make)


MANY_URI = "json-schema:///eventpipe-plan"
"""Where the validator of many events finds a plan without an absolute ``$id``."""


def compiled_many(path: Path, schema: dict[str, Any]) -> Any:
    """The validator of a JSON array whose items all meet the plan: the plan is a
    resource of its registry, under its ``$id`` (or :data:`MANY_URI`), and the array's
    items refer to it, so that its own references resolve as they do in
    :func:`compiled`'s; made once per schema. None where the plan cannot be referred to
    so (its events are then checked one by one). It only ever says whether all items
    meet the plan; why one does not is :func:`compiled`'s to say."""
    import jsonschema_rs

    def make() -> Any:
        own = schema.get("$id")
        uri = own if type(own) is str and ":" in own.split("/", 1)[0] else MANY_URI
        wrapper: dict[str, Any] = {"type": "array", "items": {"$ref": uri}}
        if "$schema" in schema:
            wrapper["$schema"] = schema["$schema"]
        try:
            registry = jsonschema_rs.Registry([(uri, schema)])
            return jsonschema_rs.validator_for(wrapper, validate_formats=True, offline=True,
                                               registry=registry)  # fmt: skip
        except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError):
            return None

    return _made(b"many", path, schema, make)


def _made(kind: bytes, path: Path, schema: dict[str, Any], make: Callable[[], Any]) -> Any:
    """``make()``'s validator of ``kind`` for ``schema``, made once per schema."""
    import hashlib

    import orjson

    try:
        key = kind + hashlib.sha256(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)).digest()
    except TypeError as exc:  # YAML that is not JSON: a set, a key that is not text
        raise PlanError(f"{path}: not a JSON Schema: {exc}") from None
    with _compiled_lock:
        if key in _compiled:
            return _compiled[key]
    validator = make()
    with _compiled_lock:
        if len(_compiled) >= MAX_COMPILED:
            _compiled.clear()
        _compiled[key] = validator
    return validator
