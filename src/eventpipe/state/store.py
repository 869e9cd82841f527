"""The state store: SQLite under ``data/state.sqlite`` by default, or PostgreSQL
(``state: {type: postgres}``; state/db.py keeps the two apart).

* ``runs``: one row per pipeline run with the exact list of segments it took, and its
  plan: which of them each destination loads (a destination that was stopped has more
  segments to catch up on than the others). A run is written *before* anything is
  loaded, so that a run interrupted by a crash is resumed with the same plan, and so the
  same batch ids: destinations recognise what they already committed and load nothing
  twice. A run stays unfinished while any destination of its plan has not finished it.
* ``segment_status``: segment x destination x table, ``ok`` or ``failed`` with the error
  and the number of attempts (seed 1's DestinationStatus). ``tbl = '*'`` marks a
  destination that finished every table of a segment.
* ``run_tables``: the run history per destination x table: rows loaded, ok or failed
  with the error, so that "what happened to yesterday's data" has an answer (``eventpipe
  status --history``). ``runs.code_versions`` holds each destination's code version
  (processing/batch/version.py) the run's rows were built with.
* ``day_versions``: destination x day (UTC day of the rows' ``_timestamp``) x code
  version: each version some of that day's rows were built with, and for a day rebuilt by
  ``eventpipe reprocess`` the archive files it read, with their sha1 (``inputs``). A day
  with one row, of the current version, whose files are unchanged, is up to date
  (processing/modes/reprocess.py).
* A stream destination records each micro-batch like a segment
  (``queue.dst=<id>/batch-<n>``), one a second: once a later micro-batch is recorded,
  the older ones are folded into one row per table and UTC day
  (``queue.dst=<id>/folded-<day>``, rows summed), and their skipped/filtered/failed counts
  and the lines they read into one ``destination_runs`` row per day (their
  ``contract_counts`` likewise), so the store stays small however long the stream runs
  and the console's ledger can count a stream by day.
* ``contract_counts``: run x destination x what a contract found or held back (a tracking
  plan's violations by plan and rule; a table's schema contract by table and what it
  did: ``columns:freeze``): ``status`` and ``status --history`` show them.

Every change is one transaction, one writer at a time (SQLite in WAL mode), so a crash
leaves either the old or the new state.

The queries are written once for SQLite and PostgreSQL alike (state/db.py connects),
in a module per kind of record: ``runs.py``, ``progress.py`` (segments, cursors,
streams), ``days.py``, ``summaries.py`` (what ``status`` reads); ``records.py`` holds the
records themselves. StateStore is all of them on one database.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eventpipe.state.days import DayRecords
from eventpipe.state.db import PostgresDatabase
from eventpipe.state.progress import SegmentProgress
from eventpipe.state.records import (
    ACKED_TABLE,
    ALL_TABLES,
    REPROCESS,
    SENT_TABLE,
    DayVersion,
    DestinationSummary,
    Part,
    Run,
    RunRecord,
    TableProgress,
    TableRun,
    micro_batch,
    stream_run,
)
from eventpipe.state.runs import RunRecords
from eventpipe.state.summaries import Summaries

if TYPE_CHECKING:
    from eventpipe.config import Config

__all__ = [
    "ACKED_TABLE",
    "ALL_TABLES",
    "REPROCESS",
    "SENT_TABLE",
    "DayVersion",
    "DestinationSummary",
    "Part",
    "Run",
    "RunRecord",
    "StateStore",
    "TableProgress",
    "TableRun",
    "micro_batch",
    "open_state",
    "stream_run",
]


class StateStore(RunRecords, SegmentProgress, DayRecords, Summaries):
    """Every record of the state store, on one database (SQLite or PostgreSQL)."""


def open_state(config: Config) -> StateStore:
    """The state store ``config`` names (``state:``): SQLite under ``data_dir`` by default."""
    if config.state.type == "postgres":
        assert config.state.dsn is not None  # the config checked it
        return StateStore(PostgresDatabase(config.state.dsn, config.state.db_schema))
    return StateStore(config.layout.state)
