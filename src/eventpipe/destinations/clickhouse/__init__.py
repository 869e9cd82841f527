"""The ClickHouse destination (``type: clickhouse``): the destination (destination.py),
its HTTP client (client.py) and the Native format its loads are sent in (native.py)."""

from eventpipe.destinations.clickhouse.destination import ClickHouseDestination

__all__ = ["ClickHouseDestination"]
