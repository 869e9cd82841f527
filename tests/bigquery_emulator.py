"""bqemulator as the BigQuery tests start it (run by .venv-bigquery's Python:
tests/bigquery.py), with six changes to the emulator:

* no spatial extension: bqemulator loads it at start for GEOGRAPHY, and it cannot be
  downloaded here (eventpipe writes no GEOGRAPHY column);
* BIGNUMERIC as DECIMAL(38, 0): bqemulator maps it to DECIMAL(76, 38), which no DuckDB
  release takes (38 digits at most); eventpipe's BIGNUMERIC columns hold integers of
  at most 38 digits (INT128);
* a table's schema updated through the API (``tables.patch``/``update``, how eventpipe
  adds columns, as BigQuery's clients do) gets its new columns in storage too, as in
  BigQuery: bqemulator changed its catalog only, and a load into the new column failed;
* a load job uploaded with a job id of the client's (``jobReference.jobId``) gets that
  id, and a second job of an id that exists is refused (409 ``duplicate``), as BigQuery
  does: bqemulator gave every upload an id of its own, so a retried load with the same
  id ran twice;
* a Parquet load matches the file's columns to the table's by name, as BigQuery does
  (a column the file lacks loads as NULL; a field the table lacks is refused, or
  ignored when the job sets ``ignoreUnknownValues``): bqemulator inserted the file's
  columns by position;
* committing a Storage Write API stream committed before answers
  ``STREAM_ALREADY_COMMITTED``, as BigQuery does (bqemulator answered
  ``INVALID_STREAM_STATE``, which says nothing of whether the rows are in).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from bqemulator.api.routes import upload
from bqemulator.api.routes.tables import _field_to_rest
from bqemulator.catalog.duckdb_repository import DuckDBCatalogRepository
from bqemulator.catalog.memory_repository import MemoryCatalogRepository
from bqemulator.cli import main
from bqemulator.domain.errors import AlreadyExistsError
from bqemulator.grpc_api import write_servicer
from bqemulator.jobs import executor
from bqemulator.storage import engine, type_map
from bqemulator.storage.sql_identifiers import quoted_table_ref
from bqemulator.storage.type_map import bq_schema_to_duckdb_columns


def _no_spatial(self: object) -> None:
    return None


def _altering(update: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def update_table(self: Any, table: Any) -> Any:
        before = self.get_table(table.project_id, table.dataset_id, table.table_id)
        result = update(self, table)
        storage = getattr(self, "_engine", None)
        if before is not None and storage is not None:
            present = {f.name for f in before.schema_.fields}
            added = [_field_to_rest(f) for f in table.schema_.fields if f.name not in present]
            where = quoted_table_ref(table.project_id, table.dataset_id, table.table_id)
            for name, kind in bq_schema_to_duckdb_columns(added) if added else []:
                storage.execute(f'ALTER TABLE {where} ADD COLUMN "{name}" {kind}')
        return result

    return update_table


_JOB_ID = "_eventpipe_job_id"
_new_job_id = upload._new_job_id
_configuration = upload._load_configuration_from_envelope
_run_load = upload._run_load
_given: list[str] = []
_ignoring_unknown: ContextVar[bool] = ContextVar("ignoring_unknown", default=False)


def _configuration_with_id(envelope: dict[str, Any]) -> dict[str, Any]:
    """The envelope's configuration, carrying its job id along (a resumable upload keeps
    the configuration alone until its last chunk)."""
    configuration = dict(_configuration(envelope))
    job_id = (envelope.get("jobReference") or {}).get("jobId")
    if job_id:
        configuration[_JOB_ID] = job_id
    return configuration


async def _run_load_with_id(
    *, project_id: str, configuration: dict[str, Any], media_path: str, ctx: Any
) -> Any:
    configuration = dict(configuration)
    job_id = configuration.pop(_JOB_ID, None)
    if job_id and ctx.catalog.get_job(project_id, job_id) is not None:
        raise AlreadyExistsError(f"Already Exists: Job {project_id}:US.{job_id}")
    if job_id:
        _given.append(job_id)
    _ignoring_unknown.set(bool((configuration.get("load") or {}).get("ignoreUnknownValues")))
    try:
        return await _run_load(project_id=project_id, configuration=configuration,
                               media_path=media_path, ctx=ctx)  # fmt: skip
    finally:
        if job_id:
            _given.remove(job_id)


def _load_parquet_by_name(path: str, target_ref: str, ctx: Any) -> None:
    def names(sql: str, *parameters: str) -> list[str]:
        return [row[0] for row in ctx.engine.execute(sql, list(parameters)).fetchall()]

    table = names(f"DESCRIBE {target_ref}")
    fields = names("DESCRIBE SELECT * FROM read_parquet(?)", path)
    unknown = [f for f in fields if f not in table]
    if unknown and not _ignoring_unknown.get():
        raise ValueError(f"Provided Schema does not match Table. Field {unknown[0]} "
                                "is not in the table's schema")  # fmt: skip
    shared = ", ".join(f'"{c}"' for c in table if c in fields)
    ctx.engine.execute(f"INSERT INTO {target_ref} ({shared}) SELECT {shared} "
                       "FROM read_parquet(?)", [path])  # fmt: skip


def _committing(commit: Callable[..., bytes]) -> Callable[..., bytes]:
    def batch_commit(self: Any, request_bytes: bytes, context: Any) -> bytes:
        from google.cloud.bigquery_storage_v1 import types

        request = types.BatchCommitWriteStreamsRequest.deserialize(request_bytes)
        done = [
            name
            for name in request.write_streams
            if (s := self._manager.get(name)) is not None and s.state.name == "COMMITTED"
        ]
        if not done:
            return commit(self, request_bytes, context)
        errors = [
            types.StorageError(
                code=types.StorageError.StorageErrorCode.STREAM_ALREADY_COMMITTED,
                entity=name,
                error_message=f"Stream is already committed: {name}",
            )
            for name in done
        ]
        answer = types.BatchCommitWriteStreamsResponse(stream_errors=errors)
        return bytes(types.BatchCommitWriteStreamsResponse.serialize(answer))

    return batch_commit


def _job_id() -> str:
    return _given[-1] if _given else _new_job_id()


upload._load_configuration_from_envelope = _configuration_with_id
upload._run_load = _run_load_with_id
upload._new_job_id = _job_id
servicer = write_servicer.BigQueryWriteHandler
servicer._handle_batch_commit_write_streams = _committing(  # type: ignore[method-assign]
    servicer._handle_batch_commit_write_streams
)
executor._LOAD_FORMAT_HANDLERS["PARQUET"] = _load_parquet_by_name
engine.DuckDBEngine._load_spatial = _no_spatial  # type: ignore[method-assign]
type_map._BQ_TO_DUCKDB["BIGNUMERIC"] = "DECIMAL(38, 0)"
for repository in (DuckDBCatalogRepository, MemoryCatalogRepository):
    repository.update_table = _altering(repository.update_table)  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(["start", *sys.argv[1:]]))
