"""Apache Iceberg tables (``type: iceberg``), committed through pyiceberg.

The tables are registered in a catalog (config ``catalog:``): pyiceberg's SQL catalog
on SQLite by default (``<data_dir>/iceberg_catalog.db``), on PostgreSQL to share it
between hosts, or a REST catalog. A table per ``table_name_template`` result, in the
catalog's namespace (default: the destination's id), its files in ``<path>/<table>``, a
local directory or an S3 prefix (pyiceberg's pyarrow FileIO; a commit is one new
metadata file swapped in by the catalog, so no rename is needed).
What the formats share is in destinations/lakehouse.py; this module is Iceberg's
commits:

* a load is one snapshot (``append``; with a primary key pyiceberg's ``upsert``, which
  rewrites the data files holding the keys it updates: copy-on-write, no equality
  deletes) whose summary carries the batch's id, rows and rejected rows;
* new columns: a schema update (``union_by_name``);
* a reprocessed day: one transaction that deletes the day's rows and appends the
  rebuilt ones (``overwrite`` with a filter on ``_timestamp``);
* partitioned by Iceberg's ``day`` transform of ``_timestamp`` (hidden partitioning:
  readers filter on ``_timestamp`` and skip the other days); the primary key is the
  table property ``eventpipe.primary-key``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import date, datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventpipe.destinations.lakehouse import Commit, LakehouseDestination, batch_key, day_bounds
from eventpipe.locks import Locks
from eventpipe.objectstore import Location

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table as IcebergTable
    from pyiceberg.table import Transaction

KEY_PROPERTY = "eventpipe.primary-key"
TABLE_PROPERTIES = {
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "100",
}
"""Each commit writes a metadata file: the table keeps the last 100 (Iceberg's own
setting), not one per batch forever."""


class IcebergDestination(LakehouseDestination):
    """Iceberg tables in a local directory or under an S3 prefix, registered in ``catalog``."""

    def __init__(
        self,
        destination_id: str,
        root: Path | Location,
        locks: Locks,
        catalog: dict[str, str],
        namespace: str,
        partition_by: str = "day",
    ) -> None:
        super().__init__(destination_id, root, locks, partition_by)
        self.catalog_properties = catalog
        self.namespace = namespace

    @property
    def _file_io(self) -> dict[str, str]:
        """pyiceberg's FileIO properties: how an S3 location is reached (kept in memory,
        never in the catalog)."""
        return self.location.s3.iceberg_properties() if self.location.s3 is not None else {}

    @cached_property
    def catalog(self) -> Catalog:
        from pyiceberg.catalog import load_catalog

        catalog = load_catalog(self.id, **{"warehouse": self.location.as_uri(),
                                           **self._file_io, **self.catalog_properties})  # fmt: skip
        engine = getattr(catalog, "engine", None)
        if engine is not None:  # the SQL catalog: no connection kept between operations
            from sqlalchemy import create_engine
            from sqlalchemy.pool import NullPool

            engine.dispose()
            catalog.engine = create_engine(engine.url, poolclass=NullPool)  # type: ignore[attr-defined]
        catalog.create_namespace_if_not_exists(self.namespace)
        return catalog

    def _open(self, table: str) -> IcebergTable | None:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table((self.namespace, table))
        except NoSuchTableError:
            return None

    def _schema(self, table: str) -> tuple[pa.Schema, tuple[str, ...]] | None:
        import pyarrow as pa

        found = self._open(table)
        if found is None:
            return None
        schema = found.schema().as_arrow()
        key = tuple(json.loads(found.properties.get(KEY_PROPERTY, "[]")))
        return pa.schema([f.remove_metadata() for f in schema]), key

    def _create(self, table: str, schema: pa.Schema, primary_key: tuple[str, ...]) -> None:
        from pyiceberg.transforms import DayTransform

        if not self.location.remote:
            Path(self.location.uri).mkdir(parents=True, exist_ok=True)
        create = self.catalog.create_table_transaction(
            (self.namespace, table),
            schema=schema,
            location=self.location.as_uri(table),
            properties={
                **TABLE_PROPERTIES,
                **({KEY_PROPERTY: json.dumps(list(primary_key))} if primary_key else {}),
            },
        )
        if self.partitioned(schema.names):
            with create.update_spec() as spec:
                spec.add_field("_timestamp", DayTransform(), "_timestamp_day")
        create.commit_transaction()

    def _commits(self, table: str) -> Iterator[Commit]:
        found = self._open(table)
        if found is None:
            return
        for snapshot in reversed(found.metadata.snapshots):
            if snapshot.summary is not None:
                commit = Commit.of(snapshot.summary.additional_properties)
                if commit is not None:
                    yield commit

    def _committed(self, table: str, batch_id: str) -> Commit | None:
        key = batch_key(batch_id)
        return next((c for c in self._commits(table) if batch_key(c.batch_id) == key), None)

    def _append(self, table: str, rows: pa.Table, commit: Commit, add: pa.Schema | None) -> None:
        found = self._open(table)
        assert found is not None
        with found.transaction() as tx:
            _add_columns(tx, add)
            tx.append(rows, snapshot_properties=commit.properties())

    def _upsert(
        self,
        table: str,
        rows: pa.Table,
        primary_key: tuple[str, ...],
        commit: Commit,
        add: pa.Schema | None,
    ) -> None:
        """Copy-on-write of the affected partitions, in one transaction: the days that
        hold a key of the batch (or get a row of it) are read, their rows of the batch's
        keys replaced by the batch's newer rows, and written again with an ``overwrite``
        of those days. No equality deletes (few readers apply them cheaply), and no
        filter with a literal per key (pyiceberg's ``upsert`` binds one: 20 s for 100,000
        keys, bench/lakehouse.py). A table not partitioned by day is one partition."""
        import pyarrow as pa

        found = self._open(table)
        assert found is not None
        if found.current_snapshot() is None:
            self._append(table, rows, commit, add)
            return
        q = self.dialect.quote
        same = " AND ".join(f"p.{q(c)} = s.{q(c)}" for c in primary_key)
        by_day = bool(found.spec().fields) and "_timestamp" in rows.column_names
        with self._duckdb() as db:
            db.register("present", self._read(table))
            db.register("batch", rows)
            newer = "batch"
            if "_timestamp" in rows.column_names:
                ts = q("_timestamp")
                newer = (
                    f"(SELECT s.* FROM batch AS s WHERE NOT EXISTS (SELECT 1 FROM present AS p "
                    f"WHERE {same} AND p.{ts} > s.{ts}))"
                )
            db.execute(f"CREATE TEMP TABLE newer AS SELECT * FROM {newer}")
            days: list[str] = []
            affected = ""
            if by_day:
                day = "strftime(CAST({}._timestamp AS DATE), '%Y-%m-%d')"
                found_days = db.sql(
                    f"SELECT DISTINCT {day.format('p')} FROM present AS p JOIN newer AS s "
                    f"ON {same} UNION SELECT DISTINCT {day.format('s')} FROM newer AS s"
                ).fetchall()
                days = sorted(d for (d,) in found_days if d is not None)
                if not days:
                    return
                affected = f"{day.format('p')} IN ({', '.join(repr(d) for d in days)}) AND "
            kept = db.sql(
                f"SELECT p.* FROM present AS p WHERE {affected}NOT EXISTS "
                f"(SELECT 1 FROM newer AS s WHERE {same})"
            ).to_arrow_table()
            replacing = db.sql("SELECT * FROM newer").to_arrow_table()
        if not replacing.num_rows:
            return
        out = pa.concat_tables([_widened(kept, rows.schema), replacing.cast(rows.schema)])
        with found.transaction() as tx:
            _add_columns(tx, add)
            tx.overwrite(out, overwrite_filter=_of_days(days) if by_day else "true",
                         snapshot_properties=commit.properties())  # fmt: skip

    def _overwrite(self, table: str, rows: pa.Table, commit: Commit, add: pa.Schema | None) -> None:
        import warnings

        found = self._open(table)
        assert found is not None
        with found.transaction() as tx, warnings.catch_warnings():
            # An empty table: nothing to delete, which pyiceberg warns of.
            warnings.filterwarnings("ignore", "Delete operation did not match any records")
            _add_columns(tx, add)
            tx.overwrite(rows, snapshot_properties=commit.properties())

    def _replace(
        self, table: str, days: Sequence[str], rows: pa.Table, commit: Commit, add: pa.Schema | None
    ) -> None:
        found = self._open(table)
        assert found is not None
        with found.transaction() as tx:
            _add_columns(tx, add)
            tx.overwrite(rows, overwrite_filter=_of_days(days),
                         snapshot_properties=commit.properties())  # fmt: skip

    def _compact(self, table: str) -> tuple[int, int]:
        """Each partition (day) of more than one data file rewritten into one, all in one
        transaction (pyiceberg has no rewrite of data files yet: a day's rows are read
        and written again with an ``overwrite`` of that day)."""
        found = self._open(table)
        assert found is not None
        files: dict[tuple[Any, ...], int] = {}
        for task in found.scan().plan_files():
            part = task.file.partition
            key: tuple[Any, ...] = tuple(part[i] for i in range(len(part)))
            files[key] = files.get(key, 0) + 1
        before = sum(files.values())
        crowded = [key for key, n in files.items() if n > 1]
        if crowded:
            partitioned = bool(found.spec().fields)
            with found.transaction() as tx:
                for key in crowded:
                    where = _of_days([_epoch_day(key[0])]) if partitioned else "true"
                    rows = found.scan(row_filter=where).to_arrow()
                    tx.overwrite(rows, overwrite_filter=where,
                                 snapshot_properties={"eventpipe.compacted": "true"})  # fmt: skip
        compacted = self._open(table)
        assert compacted is not None
        return before, len(list(compacted.scan().plan_files()))

    def _expire(self, table: str, before: datetime) -> tuple[int, int]:
        """Snapshots older than ``before`` expired (the current one kept), then the data
        and manifest files that no remaining snapshot names and that are older than
        ``before`` deleted (pyiceberg's expiry removes snapshots from the metadata only)."""
        found = self._open(table)
        assert found is not None
        current = found.current_snapshot()
        old = [
            s.snapshot_id
            for s in found.metadata.snapshots
            if s.timestamp_ms < before.timestamp() * 1000
            and (current is None or s.snapshot_id != current.snapshot_id)
        ]
        if old:
            found.maintenance.expire_snapshots().by_ids(old).commit()
        found = self._open(table)
        assert found is not None
        import pyarrow.fs as pafs

        at = self.location.fs_path
        named = {
            *(at(p) for p in found.inspect.all_files()["file_path"].to_pylist()),
            *(at(p) for p in found.inspect.all_manifests()["path"].to_pylist()),
            *(at(s.manifest_list) for s in found.metadata.snapshots),
        }
        fs, root = self.location.filesystem(), at(found.location())
        deleted = 0
        for directory, suffix in (("data", ".parquet"), ("metadata", ".avro")):
            selector = pafs.FileSelector(f"{root}/{directory}", recursive=True,
                                         allow_not_found=True)  # fmt: skip
            for entry in fs.get_file_info(selector):
                if (entry.type == pafs.FileType.File and entry.path.endswith(suffix)
                        and entry.path not in named and entry.mtime is not None
                        and entry.mtime.timestamp() < before.timestamp()):  # fmt: skip
                    fs.delete_file(entry.path)
                    deleted += 1
        return len(old), deleted

    def _read(self, table: str) -> Any:
        """The current snapshot's data files as one Arrow dataset in the table's schema
        (read lazily); through pyiceberg's scan when there are delete files."""
        import pyarrow.dataset as ds

        found = self._open(table)
        assert found is not None
        schema = found.schema().as_arrow()
        tasks = list(found.scan().plan_files())
        if any(task.delete_files for task in tasks):
            return found.scan().to_arrow()
        paths = [self.location.fs_path(task.file.file_path) for task in tasks]
        if not paths:
            return schema.empty_table()
        return ds.dataset(paths, schema=schema, format="parquet",
                          filesystem=self.location.filesystem())  # fmt: skip

    def tables(self) -> list[str]:
        from pyiceberg.exceptions import NoSuchNamespaceError

        try:
            return sorted(name for _, name in self.catalog.list_tables(self.namespace))
        except NoSuchNamespaceError:
            return []

    def _drop(self, table: str) -> None:
        found = self._open(table)
        if found is None:
            return
        self.catalog.drop_table((self.namespace, table))
        self.location.remove(found.location())


def _widened(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` in ``schema``: columns it lacks (added by this commit) as nulls."""
    import pyarrow as pa

    missing = [f for f in schema if f.name not in rows.column_names]
    for field in missing:
        rows = rows.append_column(field, pa.nulls(rows.num_rows, field.type))
    return rows.select(schema.names).cast(schema)


def _add_columns(tx: Transaction, add: pa.Schema | None) -> None:
    """The columns ``add`` (new field ids, nullable) in the transaction ``tx``."""
    if add is not None:
        with tx.update_schema() as update:
            update.union_by_name(add)


def _epoch_day(value: int) -> str:
    """The day a ``day`` partition value (days since 1970-01-01) stands for."""
    return (date(1970, 1, 1) + timedelta(days=int(value))).isoformat()


def _of_days(days: Sequence[str]) -> str:
    """pyiceberg's filter of the rows whose ``_timestamp`` falls in ``days``."""
    return " OR ".join(
        f"(_timestamp >= '{a.isoformat()}' AND _timestamp < '{b.isoformat()}')"
        for a, b in day_bounds(days)
    )
