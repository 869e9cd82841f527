"""Each destination's days by the code versions their rows were built with, and the
archive files a reprocessed day read (``eventpipe reprocess``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from eventpipe.state.db import Store
from eventpipe.state.records import (
    DayVersion,
    now_text,
)


class DayRecords(Store):
    """Each destination's days and their code versions."""

    def record_days(
        self, destination: str, days: Sequence[str], code_version: str, run_id: str
    ) -> None:
        """Rows of ``days`` were loaded into ``destination`` built with ``code_version``."""
        with self._db() as db:
            db.executemany(
                "INSERT INTO day_versions (destination, day, code_version, run_id, updated_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                [(destination, day, code_version, run_id, now_text()) for day in days],
            )

    def day_versions(self, destination: str, first: str, last: str) -> dict[str, list[DayVersion]]:
        """The recorded versions of ``destination``'s days ``first``..``last``, by day."""
        with self._db() as db:
            rows = db.execute(
                "SELECT day, code_version, inputs, run_id FROM day_versions "
                "WHERE destination = ? AND day BETWEEN ? AND ? ORDER BY day, code_version",
                (destination, first, last),
            ).fetchall()
        found: dict[str, list[DayVersion]] = {}
        for day, version, inputs, run_id in rows:
            recorded = None if inputs is None else json.loads(inputs)
            found.setdefault(day, []).append(DayVersion(day, version, recorded, run_id))
        return found

    def reprocessed_days(
        self,
        destination: str,
        days: Sequence[str],
        code_version: str,
        inputs: Mapping[str, str],
        run_id: str,
    ) -> None:
        """A reprocess replaced ``destination``'s rows of ``days``: their only version now,
        and the run is done (its per-table progress records are dropped)."""
        recorded = json.dumps(dict(inputs), sort_keys=True)
        with self._db() as db:
            db.executemany(
                "DELETE FROM day_versions WHERE destination = ? AND day = ?",
                [(destination, day) for day in days],
            )
            db.executemany(
                "INSERT INTO day_versions VALUES (?, ?, ?, ?, ?, ?)",
                [(destination, day, code_version, recorded, run_id, now_text()) for day in days],
            )
            db.execute(
                "DELETE FROM segment_status WHERE run_id = ? AND destination = ?",
                (run_id, destination),
            )
            db.execute(
                "UPDATE runs SET status = 'done', finished_at = ?, error = NULL WHERE run_id = ?",
                (now_text(), run_id),
            )
