"""The durable log: segments written by the collector, read by the pipeline."""
