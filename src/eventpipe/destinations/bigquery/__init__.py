"""The BigQuery destination (``type: bigquery``): the destination (destination.py), its
REST client for the calls the Python client lacks (api.py), its types (schema.py) and its
loads through the Storage Write API (write.py)."""

from eventpipe.destinations.bigquery.destination import BigQueryDestination

__all__ = ["BigQueryDestination"]
