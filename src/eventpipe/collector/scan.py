"""One pass over the bytes of a request for what is rare but must never be missed.

Each request's body and each append's lines are searched for several things: a run of
20 digits (an integer orjson would round), ``e-400`` (a number it would read as 0), an
empty key, a line with more brackets than ``max_json_depth`` allows, a ``writeKey``
field, the configured secrets. Done with Python's own byte searches that was one pass
per thing, about 0.2-0.7 us each per event of 450 bytes (``bytes.translate``, a regular
expression, ``lower()``, ``count``, ``in``), some 2 us of the 7-8 us an event cost a
worker in 100-event posts (docs/collector.md, "Performance").

`Hyperscan <https://github.com/intel/hyperscan>`_ (through the ``hyperscan`` package,
wheels for Linux x86-64 and arm64, macOS and Windows) searches for a set of patterns in
one pass, in time linear in the input whatever the patterns, and says which of them
occur. Patterns compile once per process (:func:`functools.cache`); a scan needs
scratch space of its own per thread (Hyperscan refuses one used by two scans at once).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import cast

import hyperscan

_ONCE = hyperscan.HS_FLAG_SINGLEMATCH


class Patterns:
    """Patterns searched for together: :meth:`found` says which occur in some bytes.

    ``patterns``: each a regular expression (Hyperscan's syntax, PCRE's subset) or, with
    ``literal``, bytes to find as they are; ``caseless``: the indexes of those matched in
    any ASCII case."""

    def __init__(
        self,
        patterns: Sequence[bytes],
        *,
        literal: bool = False,
        caseless: frozenset[int] = frozenset(),
    ) -> None:
        self.count = len(patterns)
        self._database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        if patterns:
            flags = [_ONCE | (hyperscan.HS_FLAG_CASELESS if i in caseless else 0)
                     for i in range(len(patterns))]  # fmt: skip
            ids = list(range(len(patterns)))
            self._database.compile(expressions=list(patterns), ids=ids, elements=len(patterns),
                                   flags=flags, literal=literal)  # fmt: skip
        self._local = threading.local()

    def found(self, data: bytes) -> int:
        """Which patterns occur in ``data``: bit ``i`` set for the pattern at index ``i``."""
        if not self.count or not data:
            return 0
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = hyperscan.Scratch(self._database)
        seen = [0]
        self._database.scan(data, match_event_handler=_note, context=seen, scratch=scratch)
        return seen[0]


def _note(pattern: int, start: int, end: int, flags: int, seen: object) -> bool | None:
    cast("list[int]", seen)[0] |= 1 << pattern
    return None  # go on: the other patterns may occur too


BIG_INTEGER, TINY_NUMBER, EMPTY_KEY = 1, 2, 4
"""What :data:`BODY` finds, by bit."""

BODY = Patterns([
    rb"[0-9]{20}",  # an integer past 64 bits (or a long fraction: read again, harmless)
    # ``e-400`` ending a number (what may follow one comes next): a UUID's ``7e-4123-`` is
    # not one, and most UUIDs hold an ``e-``.
    rb"[eE]-[0-9]{3,}[,\]}\s]",
    rb'""\s*:',  # a key named "" (or one ending in an escaped quote: walked for nothing)
])  # fmt: skip
"""Searched for in every body before its events are read (body.py)."""


@functools.cache
def crowded_lines(most: int) -> Patterns:
    """A line (up to its newline) with more than ``most`` ``{`` and ``[`` bytes: the
    only lines that may nest deeper than a depth of ``most`` (inside strings too, so a
    line found is checked exactly, enrich.py)."""
    return Patterns([rb"(?:[^{\[\n]*[{\[]){%d}" % (most + 1)])
