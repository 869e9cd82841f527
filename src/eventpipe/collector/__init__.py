"""HTTP ingest: routes, keys, context enrichment, limits, backpressure."""
