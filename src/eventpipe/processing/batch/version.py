"""Code versions: what a destination's rows were built with.

A destination's code version is a digest of eventpipe's version and of every setting that
changes the rows it receives: its type (the SQL types), key filter, table name template,
namespace and transforms (with the source of each python transform's module), mapping,
enrichment rules, primary key, column limit, partitioning and payload shape, and the
shared lookup settings. Connection settings (paths, DSNs, URLs, headers, batch and
retry sizes) are not part of it: moving a warehouse does not change its rows. Seed 4's
``code_ver``: a run records the versions it used, so that the rows built with older
processing can be found and rebuilt.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect

import orjson

from eventpipe import __version__
from eventpipe.config import Config, DestinationConfig
from eventpipe.errors import ConfigError

PROCESSING_SETTINGS = frozenset({
    "type", "only_keys", "table_name_template", "primary_key", "enrichment", "mappings",
    "max_columns", "partition_by", "format", "group_by", "namespace", "transforms",
})  # fmt: skip
ADDED_SETTINGS = ("namespace", "transforms")
"""Settings added after code versions were first recorded: left out at their defaults."""
ADDED_STEP_KEYS = ("hash", "secret")
"""Keys of a transform step added after transforms were: left out when absent."""
OTHER_TYPES_SETTINGS = {"primary_key": [], "partition_by": "day", "format": "dataset",
                        "group_by": []}  # fmt: skip
"""Settings of some types only, as every destination's versions were made with them
(one model held all types' keys): a type without one counts it at this value, so that
versions stay what they were."""


def code_version(config: Config, destination: str) -> str:
    """12 hex digits (sha1 as a fast digest, not for security)."""
    dest = config.destinations[destination]
    settings = OTHER_TYPES_SETTINGS | dest.model_dump(mode="json", include=set(PROCESSING_SETTINGS))
    for name in ADDED_SETTINGS:  # at their defaults, versions stay what they were
        if getattr(dest, name) == DestinationConfig.model_fields[name].default:
            settings.pop(name, None)
    for dumped, step in zip(settings.get("transforms", ()), dest.transforms, strict=True):
        for name in ADDED_STEP_KEYS:  # absent, versions stay what they were
            if dumped.get(name) is None:
                dumped.pop(name, None)
        if step.secret is not None:  # its digest: a new secret, a new version
            secret = step.secret.get_secret_value().encode()
            dumped["secret"] = hashlib.sha256(b"eventpipe-version:" + secret).hexdigest()[:16]
    what = {
        "eventpipe": __version__,
        "destination": settings,
        "enrichment": config.enrichment.model_dump(mode="json"),
    }
    if sources := _python_sources(dest):
        what["python"] = sources
    digest = hashlib.sha1(orjson.dumps(what, option=orjson.OPT_SORT_KEYS), usedforsecurity=False)
    return digest.hexdigest()[:12]


def _python_sources(dest: DestinationConfig) -> dict[str, str]:
    """Each python transform's module source digest: a changed function changes the
    version, as a changed expression does."""
    found = {}
    for step in dest.transforms:
        if step.python:
            name = step.python.partition(":")[0]
            try:
                source = inspect.getsource(importlib.import_module(name)).encode()
            except (ImportError, OSError, TypeError) as exc:
                raise ConfigError(f"python transform {step.python}: {exc}") from None
            digest = hashlib.sha1(source, usedforsecurity=False).hexdigest()
            found[step.python] = digest
    return found
