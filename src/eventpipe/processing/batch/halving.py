"""Halving: the one way a part of a batch that fails is narrowed down to the events that
cause it. A load the destination refuses (load.py, ``split_load``) and a destination's
part of a run that fails twice for its data (isolation.py) both use it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

Carry = TypeVar("Carry")

Attempt = Callable[[int, int, Carry], "tuple[str | None, Carry]"]
"""Try the items ``first`` to ``end`` (a load, a run) with what the failed part they were
halved from carried; None (it went through) or why it failed, and what its own halves
carry (isolation: the tables the failed part loaded whole)."""


def halve(
    first: int,
    end: int,
    attempt: Attempt[Carry],
    carry: Carry,
    failed_alone: Callable[[int, str], None],
) -> None:
    """Try ``first`` to ``end``; a failed part is tried again in halves, the first half
    first, down to single items; ``failed_alone(position, why)`` for each item that
    fails alone (it may raise: too many). Items are tried in their order, so a caller's
    attempts are the same each time (resumable by their positions)."""
    parts: list[tuple[int, int, Carry]] = [(first, end, carry)]
    while parts:
        start, stop, carried = parts.pop()
        if start >= stop:
            continue
        why, passed = attempt(start, stop, carried)
        if why is None:
            continue
        if stop - start > 1:
            middle = (start + stop) // 2
            parts += [(middle, stop, passed), (start, middle, passed)]  # first half first
            continue
        failed_alone(start, why)
