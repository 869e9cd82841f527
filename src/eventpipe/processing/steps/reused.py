"""Column expressions built once and used again by the runs that follow.

Every micro-batch of a stream plans its job afresh, and each expression PySpark builds
is a call into the JVM through Py4J (a Column object there). Some expressions depend
only on the config and on the types of a few fields (a destination's table names: 750
calls for ``{{ event_type }}``), not on the micro-batch: those are kept here and given
to the next plan as they are (an expression that names its columns, ``F.col``, is not
bound to one DataFrame).

Kept for the Spark session they were made in: a classic session's Column holds an object
of that session's JVM, which a later session (a service that released Spark while idle
starts a new one) does not have; its expressions are built again. Under Spark Connect
an expression is the client's own and has no session.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")

MAX_KEPT = 64
"""Expressions kept at most (the oldest made goes first): a few per destination."""


class Reused:
    """Values built by ``build`` once per key and Spark session (:meth:`get`)."""

    def __init__(self, max_kept: int = MAX_KEPT) -> None:
        self.max_kept = max_kept
        self._owner: Any = None
        self._kept: dict[Hashable, Any] = {}
        self._lock = threading.Lock()  # destinations may plan on threads of their own

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        """The value kept for ``key`` in this Spark session, else ``build()``'s, kept."""
        owner = _session_owner()
        with self._lock:
            if owner is not self._owner:
                self._kept.clear()
                self._owner = owner
            if key in self._kept:
                return self._kept[key]  # type: ignore[no-any-return]
        value = build()
        with self._lock:
            if owner is self._owner:
                while len(self._kept) >= self.max_kept:
                    del self._kept[next(iter(self._kept))]
                self._kept[key] = value
        return value


def _session_owner() -> Any:
    """What a classic session's Column objects belong to (its SparkContext); None under
    Spark Connect, or before any session."""
    from pyspark import SparkContext

    return SparkContext._active_spark_context
