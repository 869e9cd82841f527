"""The web console: server-rendered pages and the JSON API under them, on what arrives,
where it went and what failed (docs/console.md). It reads the data directory and the
state store, never Spark, so it runs in a small process of its own (``eventpipe
console``; ``eventpipe run`` starts one when ``console.token`` is set)."""
