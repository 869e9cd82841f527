"""Apache Iceberg tables (``type: iceberg``), committed through pyiceberg.

The tables are registered in a catalog (config ``catalog:``): pyiceberg's SQL catalog
on SQLite by default (``<data_dir>/iceberg_catalog.db``), on PostgreSQL to share it
between hosts, or a REST catalog. A table per ``table_name_template`` result, in the
catalog's namespace (default: the destination's id), its files in ``<path>/<table>``.
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
import shutil
from collections.abc import Iterator, Sequence
from datetime import date, datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventpipe.destinations.lakehouse import Commit, LakehouseDestination, batch_key, day_bounds
from eventpipe.locks import Locks

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
    """Iceberg tables in a local directory, registered in ``catalog``."""

    def __init__(
        self,
        destination_id: str,
        root: Path,
        locks: Locks,
        catalog: dict[str, str],
        namespace: str,
        partition_by: str = "day",
    ) -> None:
        super().__init__(destination_id, root, locks, partition_by)
        self.catalog_properties = catalog
        self.namespace = namespace

    @cached_property
    def catalog(self) -> Catalog:
        from pyiceberg.catalog import load_catalog

        catalog = load_catalog(self.id, **{"warehouse": self.root.as_uri(),
                                           **self.catalog_properties})  # fmt: skip
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

        self.root.mkdir(parents=True, exist_ok=True)
        create = self.catalog.create_table_transaction(
            (self.namespace, table),
            schema=schema,
            location=(self.root / table).as_uri(),
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
        found = self._open(table)
        assert found is not None
        if found.current_snapshot() is None:
            self._append(table, rows, commit, add)
            return
        newer = self._newer_only(found, rows, primary_key)
        with found.transaction() as tx:
            _add_columns(tx, add)
            if newer.num_rows:
                tx.upsert(newer, join_cols=list(primary_key),
                          snapshot_properties=commit.properties())  # fmt: skip

    def _newer_only(
        self, found: IcebergTable, rows: pa.Table, primary_key: tuple[str, ...]
    ) -> pa.Table:
        """``rows`` but those whose key the table holds with a newer ``_timestamp``
        (pyiceberg's upsert updates whatever differs)."""
        from pyiceberg.table.upsert_util import create_match_filter

        if "_timestamp" not in rows.column_names:
            return rows
        present = found.scan(row_filter=create_match_filter(rows, list(primary_key)),
                             selected_fields=(*primary_key, "_timestamp")).to_arrow()  # fmt: skip
        if not present.num_rows:
            return rows
        q = self.dialect.quote
        same = " AND ".join(f"p.{q(c)} = s.{q(c)}" for c in primary_key)
        ts = q("_timestamp")
        with self._duckdb() as db:
            db.register("present", present)
            db.register("batch", rows)
            kept = db.sql(
                f"SELECT s.* FROM batch AS s WHERE NOT EXISTS (SELECT 1 FROM present AS p "
                f"WHERE {same} AND p.{ts} > s.{ts})"
            ).to_arrow_table()
        return kept.cast(rows.schema)

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
        named = {
            *(
                p.removeprefix("file://")
                for p in found.inspect.all_files()["file_path"].to_pylist()
            ),
            *(p.removeprefix("file://") for p in found.inspect.all_manifests()["path"].to_pylist()),
            *(s.manifest_list.removeprefix("file://") for s in found.metadata.snapshots),
        }
        root = Path(found.location().removeprefix("file://"))
        deleted = 0
        for path in [*root.glob("data/**/*.parquet"), *root.glob("metadata/*.avro")]:
            if str(path) not in named and path.stat().st_mtime < before.timestamp():
                path.unlink()
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
        paths = [task.file.file_path.removeprefix("file://") for task in tasks]
        if not paths:
            return schema.empty_table()
        return ds.dataset(paths, schema=schema, format="parquet")

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
        shutil.rmtree(Path(found.location().removeprefix("file://")), ignore_errors=True)


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
