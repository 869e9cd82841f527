"""The names eventpipe keeps for itself, and the one rule that keeps event data out of them.

eventpipe adds columns beside an event's fields while it processes a batch (the row id,
the table, the error, lookup results), columns to some tables (metering's), tables of its
own (load records, reprocess shadows) and files (a Parquet destination's metadata). Every
one of those names starts with ``_eventpipe`` (one underscore), or is seed 1's
``_unmapped_data`` column.

Event data can name anything: a top-level JSON key is a column of the frame Spark reads,
a flattened path is a column of a table, a rendered ``table_name_template`` is a table.
So a name that comes from event data and looks like eventpipe's own is **escaped** by one
deterministic rule, the same for keys, columns and tables:

    A name that starts with one or more underscores followed by ``eventpipe`` (any case),
    or that is one or more underscores followed by ``unmapped_data``, gets one more
    underscore in front.

``_eventpipe_loads`` -> ``__eventpipe_loads``, ``__eventpipe_row`` -> ``___eventpipe_row``,
``_unmapped_data`` -> ``__unmapped_data``. Escaped names start with at least two
underscores, and eventpipe's own with exactly one, so the two never meet; and since the
rule is one-to-one, two different names of an event never become the same name. Nothing
is dropped or merged with an internal column: the value is where the escaped name says.

The corrupt-record column of Spark's JSON reader is a special case: the reader itself
matches it against the keys of every line, before any renaming could happen. Its name is
drawn at random for each read (:func:`unguessable`) and renamed to :data:`CORRUPT` at
once, so no event can name it.
"""

from __future__ import annotations

import re
import secrets

PREFIX = "_eventpipe"
"""What every internal name starts with (exactly one underscore)."""

# Columns the job adds beside an event's fields while it processes a batch.
ROW = "_eventpipe_row"
"""The event's id in the run (its position among the run's events)."""
TABLE = "_eventpipe_table"
"""The event's table in the destination: a name; ``""`` to skip the event (an empty
template result); null when it failed (``ERROR`` says why); or :data:`FILTERED`."""
ERROR = "_eventpipe_error"
FILE = "_eventpipe_file"
"""The log file an unreadable line comes from (its key id names the failed/ file)."""
SEGMENT = "_eventpipe_segment"
"""The segment a row comes from, kept when the run's destinations take different ones."""
CORRUPT = "_eventpipe_corrupt"
"""A line of the log that is not a JSON object, as text (null for every event)."""
RAW = "_eventpipe_raw"
"""An event's original JSON (failed/ records carry it)."""
DAY = "_eventpipe_day"
LINE = "_eventpipe_line"
"""An event's line of the log as read (kept only while its tracking plan is checked)."""
VERDICT = "_eventpipe_verdict"
"""An event's check against its tracking plan: its plan, its violations (JSON text), the
rules broken and where; null when no plan is for it."""
CHECKED = "_eventpipe_checked"
"""The last top-level key of a line whose event the collector checked against its plan:
the plans' digest and the verdict (eventpipe.contracts.check.Contracts.mark). Never
event data: the collector drops what a client sends under this name, on every path in."""
UNCHECKED = "_eventpipe_unchecked"
"""Whether an event of a type some plan is for came without a mark the run can trust
(its verdict then still to be made)."""
TALLIED = "_eventpipe_tallied"
"""An event's plan and the rules it broke, as one item of the count of broken rules made
as a destination's rows are staged (eventpipe.processing.steps.contracts.RuleTally);
null where it broke none."""
DISCARD = "_eventpipe_discard"
"""Where the values that broke an event's plan are (JSON pointers), carried through the
mapping to the flat columns of a destination that drops them (``discard_value``)."""
LOOKUP = "_eventpipe_lookup_"
"""Prefix of the columns a run's lookups fill (one per rule and source field)."""
STAMPED = "_eventpipe_stamped_"
"""Prefix of the timestamps a micro-batch's text columns convert to while it is staged
(processing/batch/stamps.py), one per column, by number."""

FILTERED = "\x00filtered"
"""The ``TABLE`` of an event the destination's namespace or transforms dropped: no table
name has it (names are ``[a-z0-9_]``)."""

# Columns and tables in destinations.
METER_KEY = "_eventpipe_key"
"""Columns a metered table has beside the event's own: its key as text,"""
METER_ORDER_AT = "_eventpipe_order_at"
"""the time that orders the events of one key (``order_by``, else ``_timestamp``),"""
METER_WINDOW_AT = "_eventpipe_window_at"
"""the time that places it in the lookback window (``window_by``, else ``_timestamp``),"""
METER_ARRIVAL = "_eventpipe_arrival"
"""and the order it arrived in (the run's start, then its place in the run): of two
versions with the same ``order_at``, the later arrival wins."""
UNMAPPED = "_unmapped_data"
"""Seed 1's column for fields kept whole as JSON (colliding names, ``max_columns``)."""
LOADS_TABLE = "_eventpipe_loads"
"""The record of every batch a database destination loaded (its idempotence)."""
SHADOW_PREFIX = "_eventpipe_rp_"
"""Tables a reprocess builds before it swaps their rows in."""
META_DIR = "_eventpipe"
"""A Parquet destination's metadata directory (beside and inside its tables)."""

RESERVED_PATTERN = r"^_+(?:eventpipe|unmapped_data$)"
"""Names :func:`escape` changes, once lower-cased (also a Spark SQL ``rlike`` pattern)."""
_RESERVED = re.compile(RESERVED_PATTERN, re.IGNORECASE)
_ESCAPED = re.compile(r"^__+(?:eventpipe|unmapped_data$)", re.IGNORECASE)


def is_reserved(name: str) -> bool:
    """Whether ``name`` looks like one of eventpipe's names (and is escaped when it comes
    from event data)."""
    return _RESERVED.match(name) is not None


def escape(name: str) -> str:
    """``name`` from event data, out of eventpipe's names (the module's rule)."""
    return "_" + name if _RESERVED.match(name) else name


def unescape(name: str) -> str:
    """The event's own name for a name :func:`escape` produced (others are unchanged)."""
    return name[1:] if _ESCAPED.match(name) else name


def is_internal(name: str) -> bool:
    """Whether ``name`` is one of eventpipe's own names: reserved, and not escaped."""
    return _RESERVED.match(name) is not None and _ESCAPED.match(name) is None


def unguessable(prefix: str) -> str:
    """``prefix`` and 64 random bits: a name no event can know in advance."""
    return f"{prefix}_{secrets.token_hex(8)}"
