"""Delta Lake tables (``type: delta``), committed through delta-rs (``deltalake``).

A table per ``table_name_template`` result, in ``<path>/<table>`` (its ``_delta_log``
beside its data files), a local directory or an S3 prefix: on S3, delta-rs commits a
version by putting its log entry only if absent (S3's conditional writes), so a commit
still happens once or not at all, with no lock table. What the open table formats share
(conversion, idempotence, reprocess) is in destinations/lakehouse.py; this module is
Delta's commits:

* a load is one ``WRITE`` (append) or ``MERGE`` (primary key) commit carrying an
  application transaction ``eventpipe-<batch key>`` (Delta's own idempotent-write
  record, kept in the table's snapshot) and the batch's id, rows and rejected rows in
  the commit's metadata;
* new columns: one metadata commit (``alter.add_columns``);
* a reprocessed day: one ``WRITE`` with a predicate on ``_timestamp`` (Delta's
  replaceWhere), which removes the day's files and adds the rebuilt ones at once;
* partitioned by ``_eventpipe_day`` (a date column eventpipe fills from
  ``_timestamp``); the primary key is kept in the key columns' metadata.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deltalake import DeltaTable

from eventpipe.destinations.lakehouse import Commit, LakehouseDestination, batch_key, day_bounds
from eventpipe.reserved import DAY

if TYPE_CHECKING:
    import pyarrow as pa

KEY_METADATA = "eventpipe.primary-key"
"""A key column's metadata: its place in the primary key (from 0)."""
TABLE_PROPERTIES = {"delta.setTransactionRetentionDuration": "interval 30 days"}
"""Each batch leaves an application transaction in the table's snapshot: kept 30 days
(far beyond any retry of a batch), then dropped by the next checkpoint."""


class DeltaDestination(LakehouseDestination):
    """Delta tables in a local directory or under an S3 prefix."""

    def _path(self, table: str) -> str:
        return self.location.join(table)

    @property
    def _options(self) -> dict[str, str] | None:
        """delta-rs's storage options (an S3 location's endpoint and credentials)."""
        return self.location.delta_options()

    def _open(self, table: str) -> DeltaTable | None:
        path = self._path(table)
        if not self.location.remote and not Path(path, "_delta_log").is_dir():
            return None
        if not DeltaTable.is_deltatable(path, storage_options=self._options):
            return None
        return DeltaTable(path, storage_options=self._options)

    def _schema(self, table: str) -> tuple[pa.Schema, tuple[str, ...]] | None:
        import pyarrow as pa

        found = self._open(table)
        if found is None:
            return None
        schema = pa.schema(found.schema().to_arrow())
        key = sorted(
            (int(f.metadata[KEY_METADATA.encode()]), f.name)
            for f in schema
            if f.metadata and KEY_METADATA.encode() in f.metadata
        )
        own = [f.remove_metadata() for f in schema if f.name != DAY]
        return pa.schema(own), tuple(name for _, name in key)

    def _create(self, table: str, schema: pa.Schema, primary_key: tuple[str, ...]) -> None:
        import pyarrow as pa

        fields = [
            f.with_metadata({KEY_METADATA: str(primary_key.index(f.name))})
            if f.name in primary_key
            else f
            for f in schema
        ]
        partition: list[str] = []
        if self.partitioned(schema.names):
            fields.append(pa.field(DAY, pa.date32()))
            partition = [DAY]
        if not self.location.remote:
            Path(self._path(table)).mkdir(parents=True, exist_ok=True)
        DeltaTable.create(self._path(table), schema=pa.schema(fields),
                          partition_by=partition or None, mode="ignore",
                          configuration=TABLE_PROPERTIES,
                          storage_options=self._options)  # fmt: skip

    def _has_days(self, table: str) -> bool:
        found = self._open(table)
        return found is not None and DAY in found.metadata().partition_columns

    def _with_days(self, rows: pa.Table) -> pa.Table:
        import pyarrow.compute as pc

        if not self.partitioned(rows.column_names):
            return rows
        return rows.append_column(DAY, pc.cast(rows["_timestamp"], "date32"))

    def _commits(self, table: str) -> Iterator[Commit]:
        found = self._open(table)
        if found is None:
            return
        for entry in found.history():
            commit = Commit.of(entry)
            if commit is not None:
                yield commit

    def _committed(self, table: str, batch_id: str) -> Commit | None:
        found = self._open(table)
        if found is None or found.transaction_version(_app(batch_id)) is None:
            return None
        key = batch_key(batch_id)
        return next(
            (c for c in self._commits(table) if batch_key(c.batch_id) == key),
            Commit(batch_id, 0),  # the history's entry is gone (cleaned up): no rows known
        )

    def _properties(self, commit: Commit) -> Any:
        from deltalake import CommitProperties, Transaction

        return CommitProperties(
            custom_metadata=commit.properties(),
            app_transactions=[Transaction(_app(commit.batch_id), 1)],
        )

    def _append(self, table: str, rows: pa.Table, commit: Commit, add: pa.Schema | None) -> None:
        from deltalake import write_deltalake

        write_deltalake(self._path(table), self._fit(table, rows), mode="append",
                        schema_mode="merge" if add else None, storage_options=self._options,
                        commit_properties=self._properties(commit))  # fmt: skip

    def _fit(self, table: str, rows: pa.Table) -> pa.Table:
        """``rows`` with the day column if and only if the table is partitioned by it."""
        if DAY in rows.column_names and not self._has_days(table):
            return rows.drop_columns([DAY])
        return rows

    def _upsert(
        self,
        table: str,
        rows: pa.Table,
        primary_key: tuple[str, ...],
        commit: Commit,
        add: pa.Schema | None,
    ) -> None:
        found = self._open(table)
        assert found is not None
        q = self.dialect.quote
        on = " AND ".join(f"t.{q(c)} = s.{q(c)}" for c in primary_key)
        merge = found.merge(
            self._fit(table, rows), predicate=on, source_alias="s", target_alias="t",
            merge_schema=add is not None, commit_properties=self._properties(commit),
        )  # fmt: skip
        newer = None
        if "_timestamp" in rows.column_names:
            ts = q("_timestamp")
            newer = f"s.{ts} >= t.{ts} OR t.{ts} IS NULL"
        merge.when_matched_update_all(predicate=newer).when_not_matched_insert_all().execute()

    def _overwrite(self, table: str, rows: pa.Table, commit: Commit, add: pa.Schema | None) -> None:
        from deltalake import write_deltalake

        write_deltalake(self._path(table), self._fit(table, rows), mode="overwrite",
                        schema_mode="merge" if add else None, storage_options=self._options,
                        commit_properties=self._properties(commit))  # fmt: skip

    def _replace(
        self, table: str, days: Sequence[str], rows: pa.Table, commit: Commit, add: pa.Schema | None
    ) -> None:
        from deltalake import write_deltalake

        ts = self.dialect.quote("_timestamp")
        predicate = " OR ".join(
            f"({ts} >= '{a.isoformat()}' AND {ts} < '{b.isoformat()}')" for a, b in day_bounds(days)
        )
        write_deltalake(
            self._path(table), self._fit(table, rows), mode="overwrite",
            predicate=predicate, schema_mode="merge" if add else None,
            storage_options=self._options,
            commit_properties=self._properties(commit),
        )  # fmt: skip

    def _compact(self, table: str) -> tuple[int, int]:
        found = self._open(table)
        assert found is not None
        before = len(found.file_uris())
        found.optimize.compact()
        after = DeltaTable(self._path(table), storage_options=self._options)
        return before, len(after.file_uris())

    def _expire(self, table: str, before: datetime) -> tuple[int, int]:
        """Vacuum (``full``: also files no version ever named, such as those of a commit
        that failed) and the log's entries past ``delta.logRetentionDuration``."""
        found = self._open(table)
        assert found is not None
        hours = max(0, int((datetime.now(UTC) - before).total_seconds() // 3600))
        current = found.version()
        expired = sum(  # their files may be gone: no time travel to them
            1
            for entry in found.history()
            if entry["timestamp"] < before.timestamp() * 1000 and entry["version"] != current
        )
        deleted = found.vacuum(retention_hours=hours, dry_run=False,
                               enforce_retention_duration=False, full=True)  # fmt: skip
        found.cleanup_metadata()
        return expired, len(deleted)

    def _read(self, table: str) -> Any:
        found = self._open(table)
        assert found is not None
        return found.to_pyarrow_dataset()

    def tables(self) -> list[str]:
        import pyarrow.fs as pafs

        fs, root = self.location.filesystem(), self.location.fs_path(self.location.uri)
        entries = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        found = [e.base_name for e in entries if e.type == pafs.FileType.Directory]
        logs = fs.get_file_info([f"{root}/{name}/_delta_log" for name in found])
        return sorted(name for name, log in zip(found, logs, strict=True)
                      if log.type == pafs.FileType.Directory)  # fmt: skip

    def _drop(self, table: str) -> None:
        self.location.remove(self._path(table))


def _app(batch_id: str) -> str:
    """The application transaction id of a batch (Delta keeps one version per id)."""
    return f"eventpipe-{batch_key(batch_id)}"
