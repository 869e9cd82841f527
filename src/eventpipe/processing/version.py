"""Code versions: what a destination's rows were built with.

A destination's code version is a digest of eventpipe's version and of every setting that
changes the rows it receives: its type (the SQL types), key filter, table name template,
mapping, enrichment rules, primary key, column limit, partitioning and payload shape, and
the shared lookup settings. Connection settings (paths, DSNs, URLs, headers, batch and
retry sizes) are not part of it: moving a warehouse does not change its rows. Seed 4's
``code_ver``: a run records the versions it used, so that the rows built with older
processing can be found and rebuilt.
"""

from __future__ import annotations

import hashlib

import orjson

from eventpipe import __version__
from eventpipe.config import Config

PROCESSING_SETTINGS = frozenset({
    "type", "only_keys", "table_name_template", "primary_key", "enrichment", "mappings",
    "max_columns", "partition_by", "format", "group_by",
})  # fmt: skip


def code_version(config: Config, destination: str) -> str:
    """12 hex digits (sha1 as a fast digest, not for security)."""
    settings = config.destinations[destination].model_dump(
        mode="json", include=set(PROCESSING_SETTINGS)
    )
    what = {
        "eventpipe": __version__,
        "destination": settings,
        "enrichment": config.enrichment.model_dump(mode="json"),
    }
    digest = hashlib.sha1(orjson.dumps(what, option=orjson.OPT_SORT_KEYS), usedforsecurity=False)
    return digest.hexdigest()[:12]
