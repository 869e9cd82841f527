"""``eventpipe log show --destination``: events as a destination would receive them,
nothing loaded."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventpipe.config import Config
from eventpipe.processing.batch.read import stage_events
from eventpipe.processing.batch.run import (
    RunContext,
    RunReport,
    Target,
    read_catalogues,
)
from eventpipe.processing.batch.schema_cache import SchemaCache
from eventpipe.processing.batch.shape import flatten_for
from eventpipe.processing.runtime.pipeline import Runtime
from eventpipe.processing.steps.lookup import Lookups
from eventpipe.reserved import (
    ERROR,
    FILTERED,
    ROW,
    TABLE,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("eventpipe.processing")


@dataclass(frozen=True)
class Preview:
    """One event as a destination would receive it (``eventpipe log show
    --destination``)."""

    table: str | None
    """Its table; None: it would fail (``error``); "": skipped (empty table name);
    FILTERED: dropped by the destination's namespace or transforms."""
    error: str | None
    columns: dict[str, object]
    """Its flat columns that have a value."""


def preview(config: Config, spark: SparkSession, dest_id: str, lines: list[bytes]) -> list[Preview]:
    """``lines`` of the log through every step of ``dest_id`` before its tables are
    typed (keys, table name, lookups, mapping, flattening, explicit casts); nothing is
    loaded or recorded. One Preview per line, in order."""
    import tempfile

    import orjson

    def is_event(line: bytes) -> bool:
        try:
            return isinstance(orjson.loads(line), dict)
        except orjson.JSONDecodeError:
            return False

    valid = [is_event(line) for line in lines]
    runtime = Runtime(config, spark).only([dest_id])
    only = runtime.config
    lookups = Lookups.plan(only)
    rows: list[dict[str, Any]] = []
    columns: set[str] = set()  # the destination's (not the job's own)
    config.layout.tmp.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="preview-", dir=config.layout.tmp) as tmp:
        path = Path(tmp) / "events.log"
        path.write_bytes(
            b"".join(line.strip() + b"\n" for line, ok in zip(lines, valid, strict=True) if ok)
        )
        if any(valid):
            run_id = Path(tmp).name
            events = stage_events(spark, only, run_id, [str(path)], lookups, staged=False)
            dest = only.destinations[dest_id]  # opened, never written to
            opened = runtime.open_destination(dest_id)
            target = Target(dest_id, dest, (), opened, SchemaCache())
            run = RunContext(run_id, (), runtime, RunReport(run_id, (), False), events, lookups,
                             (str(path),), read_catalogues(runtime))  # fmt: skip
            ids = sorted(r[ROW] for r in events.select(ROW).collect())  # in the file's order
            flattened = flatten_for(events, run, target)
            columns = set(flattened.columns)
            flat = {r[ROW]: r.asDict() for r in flattened.frame.collect()}
            rows = [flat.get(i, {}) for i in ids]
    out: list[Preview] = []
    events_in_order = iter(rows)
    for ok in valid:
        if not ok:
            out.append(Preview(None, "line is not a JSON object", {}))
        elif not (row := next(events_in_order)):
            out.append(Preview(None, f"not for {dest_id}: its key is not in only_keys", {}))
        elif row[TABLE] == FILTERED:
            out.append(Preview(FILTERED, None, {}))
        else:
            values = {k: v for k, v in row.items() if k in columns and v is not None}
            out.append(Preview(row[TABLE], row[ERROR], values))
    return out
