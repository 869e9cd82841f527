"""What the pipeline runs on: its runtime (``pipeline.py``: the config, the state store,
the locks and the Spark session, built once per entry point and passed down), the
session with eventpipe's settings (``spark.py``), the JVM class-data archive that halves
its start (``class_data.py``), and the graceful stop on SIGTERM (``shutdown.py``).
Imports nothing else of ``processing``."""
