"""The Spark runtime the pipeline runs on: the session with eventpipe's settings
(``spark.py``), the JVM class-data archive that halves its start (``class_data.py``), and
the graceful stop on SIGTERM (``shutdown.py``). Imports nothing else of ``processing``."""
