"""Appends through BigQuery's Storage Write API (``appends: storage_write``, the default
in stream mode): a batch's rows written to a PENDING stream of its own and committed at
once, with no load job (BigQuery allows 1,500 of those a table a day; a stream of
micro-batches would spend them in 25 minutes).

Exactly once with the batch's record, in four steps (the destination's ``_written``):

1. the rows appended to a new pending stream as Arrow record batches (at most
   :data:`MAX_REQUEST_BYTES` each, each at its offset), then the stream finalized;
2. the stream's name and its rows written to ``_eventpipe_streams``: the batch prepared;
3. the stream committed (``BatchCommitWriteStreams``: its rows appear all at once);
4. the batch's record in ``_eventpipe_loads``.

A rerun finds the record (done), or the prepared stream and commits it again: BigQuery
answers ``STREAM_ALREADY_COMMITTED`` when step 3 had happened, and the record is written
either way. A crash before step 2 leaves a stream never committed, which BigQuery
discards. What is not covered: a prepared stream BigQuery no longer knows (a rerun days
after the crash) is written again, so a batch that died between steps 3 and 4 and
resumed that late would be loaded twice.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventpipe.errors import TerminalError, TransientError
from eventpipe.schema.types import DataType

if TYPE_CHECKING:
    import pyarrow as pa

MAX_REQUEST_BYTES = 8 * 1024 * 1024
"""An append's rows at most (BigQuery refuses a request over 10 MB)."""
_TRANSIENT_CODES = {4, 8, 10, 13, 14}
"""gRPC codes of an append that a later try may pass: deadline exceeded, resources
exhausted (throttled), aborted, internal, unavailable."""


def arrow_type(data_type: DataType) -> pa.DataType:
    """The Arrow type a column's values are sent as (integers beyond 64 bits are not:
    their tables append by load job)."""
    import pyarrow as pa

    return {
        DataType.STRING: pa.string(),
        DataType.FLOAT64: pa.float64(),
        DataType.INT64: pa.int64(),
        DataType.BOOL: pa.bool_(),
        DataType.TIMESTAMP: pa.timestamp("us", tz="UTC"),
    }[data_type]


def writable(columns: Sequence[DataType]) -> bool:
    """Whether a table of these column types is appended to through the Storage Write
    API (not one with integers beyond 64 bits: its rows, NULLs included, would carry a
    256-bit decimal, which could not be checked against BigQuery here)."""
    return DataType.INT128 not in columns


class StorageWriter:
    """The Storage Write API of one project and dataset (its client made once)."""

    def __init__(
        self,
        project: str,
        dataset: str,
        credentials: Any,
        endpoint: str | None,
        plaintext: bool,
        timeout: float,
    ) -> None:
        self.project = project
        self.dataset = dataset
        self.credentials = credentials
        """A service account; None: Google's application default credentials."""
        self.endpoint = endpoint
        self.plaintext = plaintext
        """``endpoint`` is a stand-in, reached without TLS or credentials."""
        self.timeout = timeout
        self._client: Any = None
        self._lock = threading.Lock()

    def client(self) -> Any:
        from google.cloud.bigquery_storage_v1 import BigQueryWriteClient

        with self._lock:
            if self._client is None:
                if self.endpoint and self.plaintext:
                    import grpc  # type: ignore[import-untyped]
                    from google.cloud.bigquery_storage_v1.services.big_query_write.transports import (  # noqa: E501
                        BigQueryWriteGrpcTransport,
                    )

                    channel = grpc.insecure_channel(self.endpoint)
                    transport = BigQueryWriteGrpcTransport(channel=channel)
                    self._client = BigQueryWriteClient(transport=transport)  # type: ignore[no-untyped-call]
                else:
                    from google.api_core.client_options import ClientOptions

                    options = ClientOptions(api_endpoint=self.endpoint) if self.endpoint else None
                    self._client = BigQueryWriteClient(  # type: ignore[no-untyped-call]
                        credentials=self.credentials, client_options=options
                    )
            return self._client

    def _table(self, table: str) -> str:
        return f"projects/{self.project}/datasets/{self.dataset}/tables/{table}"

    def write(
        self, table: str, files: Sequence[Path], columns: dict[str, DataType]
    ) -> tuple[str, int]:
        """The rows of ``files`` (``columns`` of them, sent in their Arrow types) appended
        to a new pending stream of ``table``, then finalized: its name and row count."""
        import pyarrow.parquet as pq
        from google.cloud.bigquery_storage_v1 import types

        client = self.client()
        stream = client.create_write_stream(
            parent=self._table(table),
            write_stream=types.WriteStream(type_=types.WriteStream.Type.PENDING),
            timeout=self.timeout,
        )
        offsets: list[int] = []
        if sum(pq.ParquetFile(f).metadata.num_rows for f in files):
            requests = self._requests(stream.name, files, columns, offsets)
            for answer in client.append_rows(requests, timeout=self.timeout):
                if answer.error.code:
                    raise _append_error(table, answer.error.code, answer.error.message)
                if answer.row_errors:
                    raise TerminalError(f"bigquery ({table}): a row was refused: "
                                        f"{answer.row_errors[0].message}", table=table)  # fmt: skip
        finalized = client.finalize_write_stream(name=stream.name, timeout=self.timeout)
        rows = sum(offsets)
        if int(finalized.row_count) != rows:
            raise TransientError(f"bigquery ({table}): stream {stream.name} holds "
                                 f"{finalized.row_count} rows of {rows}", table=table)  # fmt: skip
        return stream.name, rows

    def _requests(
        self, stream: str, files: Sequence[Path], columns: dict[str, DataType], sizes: list[int]
    ) -> Iterator[Any]:
        """The append requests of the files' rows, each at its offset (``sizes``: each
        request's rows, appended as they are made)."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        from google.cloud.bigquery_storage_v1 import types

        schema = pa.schema([(c, arrow_type(t)) for c, t in columns.items()])
        writer_schema = types.ArrowSchema(serialized_schema=schema.serialize().to_pybytes())
        first, offset = True, 0
        for file in files:
            parquet = pq.ParquetFile(file)
            present = [c for c in columns if c in parquet.schema_arrow.names]
            for batch in parquet.iter_batches(columns=present,
                                              batch_size=_rows_per_request(parquet)):  # fmt: skip
                for part, rows in _within_limit(_cast(batch, schema)):
                    data = types.AppendRowsRequest.ArrowData(
                        rows=types.ArrowRecordBatch(serialized_record_batch=part)
                    )
                    if first:
                        data.writer_schema = writer_schema
                    yield types.AppendRowsRequest(write_stream=stream, offset=offset,
                                                  arrow_rows=data)  # fmt: skip
                    sizes.append(rows)
                    first, offset = False, offset + rows

    def commit(self, table: str, stream: str) -> bool:
        """Commit ``stream`` of ``table``: True when its rows are in (now or by an
        earlier commit), False when BigQuery knows no such stream."""
        from google.cloud.bigquery_storage_v1 import types

        codes = types.StorageError.StorageErrorCode
        answer = self.client().batch_commit_write_streams(
            request=types.BatchCommitWriteStreamsRequest(parent=self._table(table),
                                                         write_streams=[stream]),
            timeout=self.timeout,
        )  # fmt: skip
        for error in answer.stream_errors:
            if error.code == codes.STREAM_ALREADY_COMMITTED:
                return True
            if error.code == codes.STREAM_NOT_FOUND:
                return False
            raise TerminalError(f"bigquery ({table}): committing {stream}: {error.error_message}",
                                table=table)  # fmt: skip
        return True


def _rows_per_request(parquet: Any) -> int:
    """Rows read at a time: about half a request's bytes, by the file's decoded bytes a
    row (:func:`_within_limit` halves a batch that is still over)."""
    meta = parquet.metadata
    decoded = sum(int(meta.row_group(i).total_byte_size) for i in range(meta.num_row_groups))
    row_bytes = max(1, decoded // max(1, int(meta.num_rows)))
    return max(1, MAX_REQUEST_BYTES // 2 // row_bytes)


def _cast(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with ``schema``'s columns in its types, a column it lacks as NULLs."""
    import pyarrow as pa

    names = batch.schema.names
    arrays = [
        batch.column(names.index(f.name)).cast(f.type)
        if f.name in names
        else pa.nulls(batch.num_rows, f.type)
        for f in schema
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _within_limit(batch: pa.RecordBatch) -> Iterator[tuple[bytes, int]]:
    """``batch`` serialized, and its rows, halved until each part is within
    :data:`MAX_REQUEST_BYTES` (a single row over it is sent alone, for BigQuery to
    refuse)."""
    data = batch.serialize().to_pybytes()
    if len(data) <= MAX_REQUEST_BYTES or batch.num_rows <= 1:
        yield data, batch.num_rows
        return
    half = batch.num_rows // 2
    yield from _within_limit(batch.slice(0, half))
    yield from _within_limit(batch.slice(half))


def _append_error(table: str, code: int, message: str) -> Exception:
    text = f"bigquery ({table}): an append was refused: {message}"
    if code in _TRANSIENT_CODES:
        return TransientError(text, table=table)
    return TerminalError(text, table=table)
