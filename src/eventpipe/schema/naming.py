"""Column and table names: how a JSON path becomes a column every destination accepts.

Rules, in order (seed 1 flattening, plus decisions where the seed is silent):

1. Each key of the path is lower-cased, and each character outside ``[a-z0-9_]`` becomes
   ``_`` (``"Page URL"`` -> ``page_url``, ``"x; DROP TABLE y"`` -> ``x__drop_table_y``).
2. An empty key becomes ``_unnamed``.
3. A key that has no letter or digit left (``"?!"``, ``"名前"``) becomes ``_k`` and the
   first 8 hex digits of the SHA-1 of the original key, so that distinct keys of that kind
   stay distinct and the name is the same in every batch.
4. The keys of a path are joined with ``_`` (``{"user": {"id": 1}}`` -> ``user_id``).
5. A name that starts with a digit gets a ``_`` in front (``"1a"`` -> ``_1a``).
6. A name that looks like one of eventpipe's own (``_eventpipe...``, ``_unmapped_data``)
   gets one more ``_`` in front, by :func:`eventpipe.reserved.escape`: event data never
   names an internal column or table (``{"_eventpipe": {"row": 1}}`` ->
   ``__eventpipe_row``; a table ``_eventpipe_loads`` -> ``__eventpipe_loads``).
7. Names longer than :data:`MAX_NAME_LENGTH` (PostgreSQL's limit, the smallest among the
   destinations) keep their first 54 characters plus ``_`` and 8 hex digits of the SHA-1
   of the full name (the first 54 keep rule 6's underscores: an escaped name stays so).

SQL reserved words (``select``, ``order``) are kept as they are: identifiers are always
quoted in the SQL eventpipe writes.

Two paths of one event can end as the same name (``{"A": 1, "a": 2}``, or
``{"a_b": 1, "a": {"b": 2}}``). The winner is the path with the fewest keys, then the
smallest in code-point order of its original keys; the others are kept whole in the
``_unmapped_data`` JSON column under their original path. Nothing is dropped, and the
choice depends only on the names, never on the order keys arrived in.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence

from eventpipe import reserved

MAX_NAME_LENGTH = 63
UNMAPPED_COLUMN = reserved.UNMAPPED

_OUTSIDE = re.compile(r"[^a-z0-9_]")
_HAS_ALNUM = re.compile(r"[a-z0-9]")


def _short_hash(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", errors="surrogatepass")).hexdigest()[:8]


def sanitize_key(key: str) -> str:
    """One key of a path, by rules 1-3."""
    if key == "":
        return "_unnamed"
    cleaned = _OUTSIDE.sub("_", key.lower())
    if not _HAS_ALNUM.search(cleaned):
        return "_k" + _short_hash(key)
    return cleaned


def column_name(path: Sequence[str]) -> str:
    """The column for a JSON path (its keys, outermost first), by rules 1-7."""
    name = "_".join(sanitize_key(key) for key in path)
    return finish_name(name)


def finish_name(name: str) -> str:
    """Rules 5-7 on an already joined name (also used for table names)."""
    if name[:1].isdigit():
        name = "_" + name
    name = reserved.escape(name)
    if len(name) > MAX_NAME_LENGTH:
        name = f"{name[:54]}_{_short_hash(name)}"
    return name


def table_name(text: str) -> str:
    """A table name from a rendered ``table_name_template``: sanitised like one key.

    The empty string stays empty: it means "skip this destination".
    """
    if text == "":
        return ""
    return finish_name(sanitize_key(text))


def winner(paths: Iterable[Sequence[str]]) -> tuple[str, ...]:
    """Among paths that share a column name, the one that keeps it (see module docstring)."""
    return min((tuple(p) for p in paths), key=lambda p: (len(p), p))
