"""The forms of a PostgreSQL source's values: WAL positions as integers, numbers exact,
keys as text, commit times as eventpipe writes timestamps."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from eventpipe.events import format_timestamp, utc_now


def lsn_int(lsn: str) -> int:
    """``16/B374D848`` as the 64-bit position it stands for."""
    high, low = lsn.split("/")
    return (int(high, 16) << 32) | int(low, 16)


_DIGITS = re.compile(r"^[-+]?0*([0-9]*?)\.?([0-9]*?)0*(?:[eE].*)?$")


def _significant(number: str) -> str:
    """The significant digits of a number's text (``-0012.3400e5`` -> ``1234``)."""
    found = _DIGITS.match(number)
    return (found[1] + found[2]).strip("0") if found else number


def exact_number(text: str) -> float | str:
    """A JSON number with a fraction or exponent: the float64 that reads back as the same
    digits, else its text (``24.57142857142857142857`` has more digits than a float64
    holds: kept as text, which the destinations store by the lattice as text or refuse
    for a column of numbers, never rounded)."""
    number = float(text)
    # A text of 16 characters has a "." or an "e": at most 15 digits, which a float64
    # always reads back (the common case, without the regular expressions).
    if len(text) <= 16 or _significant(repr(number)) == _significant(text):
        return number
    return text


_DECODER = json.JSONDecoder(parse_float=exact_number)
"""One decoder: ``json.loads`` with an option builds one per call (3.5x slower per row)."""


def loads(text: str) -> Any:
    """JSON as a source reads it: integers of any size (Python's), numbers with a
    fraction exact (:func:`exact_number`)."""
    return _DECODER.decode(text)


def key_text(row: dict[str, Any], key: list[str]) -> str:
    """The key of ``row`` as writers compare it: its values as a JSON array."""
    return json.dumps([row.get(name) for name in key], ensure_ascii=False, separators=(",", ":"))


def wal_timestamp(stamp: str | None) -> str:
    """wal2json's commit time (``2026-11-24 12:00:00.123456+00``) as eventpipe writes
    timestamps; now if it has none."""
    if not stamp:
        return format_timestamp(utc_now())
    text = stamp.replace(" ", "T", 1)
    if re.search(r"[+-]\d\d$", text):
        text += ":00"
    return format_timestamp(datetime.fromisoformat(text).astimezone(UTC))
