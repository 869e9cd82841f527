"""The Spark pipeline: the batch job's steps (job.py lists them), streams, replay, reprocess."""
