"""The Snowflake destination (``type: snowflake``): the destination (destination.py),
what ``eventpipe query`` may run on it (query.py) and the rows it loads (rows.py)."""

from eventpipe.destinations.snowflake.destination import SnowflakeDestination

__all__ = ["SnowflakeDestination"]
