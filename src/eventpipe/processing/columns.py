"""Names of the columns the job adds beside an event's own fields (all start with ``__``,
which sanitised column names never do)."""

from __future__ import annotations

TABLE = "__table"
"""The event's table in the destination: a name; ``""`` to skip the event (an empty
template result); null when it failed (``ERROR`` says why); or :data:`FILTERED`."""
ERROR = "__error"
ROW = "__row"
"""The event's id in the run (its position among the run's events)."""
FILTERED = "\x00filtered"
"""The ``TABLE`` of an event the destination's namespace or transforms dropped: no table
name has it (names are ``[a-z0-9_]``)."""
