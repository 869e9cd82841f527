"""The ClickHouse destination (in progress): its HTTP client (client.py) first.

Not yet in the registry: ``type: clickhouse`` is refused until the destination loads,
patches and replaces days like the others (docs/destinations.md).
"""
