"""The PostgreSQL destination (``type: postgres``): the destination (destination.py),
what ``eventpipe query`` may run on it (query.py) and the rows it loads (rows.py)."""

from eventpipe.destinations.postgres.destination import PostgresDestination

__all__ = ["PostgresDestination"]
