"""A stand-in for Amazon Redshift in the tests: the run's PostgreSQL server (Redshift
speaks PostgreSQL's protocol and, for what eventpipe sends, its SQL) behind a front of
the project's own that does what PostgreSQL cannot: ``COPY ... FROM 's3://...'
IAM_ROLE '...' FORMAT AS PARQUET``.

The front is a real TCP server on a free port of 127.0.0.1. It passes every message of
PostgreSQL's protocol through as it is, but for a simple query that is

* a ``COPY`` from S3: it checks the statement as Redshift would (an ``IAM_ROLE`` that is
  an ARN or ``default``, ``FORMAT AS PARQUET``), reads the table's columns in the
  client's own session (a temporary table is seen), reads every object under the prefix
  from the S3 stand-in (moto, tests/s3.py), checks each file as Redshift's Parquet reader
  does (as many columns as the table, matched by position; each column's Parquet type
  one the column's type takes; a text no longer than its ``varchar``'s bytes), and then
  copies the rows in through PostgreSQL's own ``COPY ... FROM STDIN`` in that session, so
  the rows are inside the client's transaction. What Redshift refuses comes back as an
  error raised in that session (SQLSTATE XX000, Redshift's wording), which aborts the
  transaction as Redshift's would.

What this does not show about Redshift (its distribution, its sort keys, its
serialisable isolation, its real load errors' tables) is said in docs/destinations.md.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import queue
import re
import socket
import struct
import threading
import uuid
from typing import Any

import psycopg

from tests.process import free_port

IAM_ROLE = "arn:aws:iam::123456789012:role/eventpipe-copy"
"""The role the tests' destinations name (the stand-in checks its form only)."""

_COPY = re.compile(
    r"^\s*COPY\s+(?P<table>.+?)\s+FROM\s+'(?P<uri>s3://[^']*)'\s+(?P<options>.*?)\s*;?\s*$",
    re.IGNORECASE | re.DOTALL,
)
_ROLE = re.compile(
    r"\bIAM_ROLE\s+(?:'arn:aws:iam::\d{12}:role/[\w+=,.@/-]+'|default)(?:\s|$)", re.IGNORECASE
)
_SSL, _GSS, _CANCEL = 80877103, 80877104, 80877102
_CHUNK = 1 << 20


class Refused(Exception):
    """What Redshift would refuse the statement with."""


class RedshiftServer:
    """The front, on a database of its own (``dev``) of the run's PostgreSQL server."""

    _databases = itertools.count()

    def __init__(self, postgres_dsn: str, s3: Any) -> None:
        self.s3 = s3
        self.database = f"dev{next(self._databases)}"
        base = psycopg.conninfo.conninfo_to_dict(postgres_dsn)
        self._upstream = (str(base.get("host", "127.0.0.1")), int(base.get("port", 5432)))
        self._admin = postgres_dsn
        self.port = free_port()
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/{self.database}"
        self._listener: socket.socket | None = None
        self._stopping = threading.Event()
        self._s3_client: Any = None
        self._client_lock = threading.Lock()
        self.copies: list[str] = []
        """Every COPY from S3 the front ran, as sent (the tests read the SQL)."""

    def settings(self, bucket: str, schema: str | None = None) -> dict[str, Any]:
        """A destination's keys for this server: staging in ``bucket``, a schema of its
        own unless named (eventpipe creates it)."""
        schema = schema or f"t_{uuid.uuid4().hex[:12]}"
        return {
            "type": "redshift", "dsn": self.dsn, "schema": schema,
            "staging": f"s3://{bucket}/staging", "iam_role": IAM_ROLE,
            "s3": self.s3.settings(),
        }  # fmt: skip

    def s3_client(self) -> Any:
        """One client of the S3 stand-in for the front's reads (boto3's clients are
        thread-safe, and slow to make)."""
        with self._client_lock:
            if self._s3_client is None:
                self._s3_client = self.s3.client()
            return self._s3_client

    def start(self) -> None:
        with psycopg.connect(self._admin, autocommit=True) as db:
            db.execute(f'CREATE DATABASE "{self.database}"')
        listener = socket.create_server(("127.0.0.1", self.port))
        listener.settimeout(0.5)
        self._listener = listener
        threading.Thread(target=self._accept, name="redshift-front", daemon=True).start()

    def remove(self) -> None:
        self._stopping.set()
        if self._listener is not None:
            self._listener.close()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self._upstream)
        except OSError:
            client.close()
            return
        for end in (server, client):  # each message as it comes: no Nagle's wait
            end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            with contextlib.suppress(OSError, ConnectionError):
                _Session(self, client, server).run()
        finally:
            # A shutdown, not just a close, ends the connection while the relay thread
            # still waits on it: the server then rolls back what the client left open.
            for end in (server, client):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()


class _Session:
    """One client's connection through the front."""

    def __init__(self, front: RedshiftServer, client: socket.socket, server: socket.socket):
        self.front = front
        self.client = client
        self.server = server
        self.diverted: queue.Queue[tuple[bytes, bytes]] | None = None
        self._divert_lock = threading.Lock()

    def run(self) -> None:
        while True:  # the startup: TLS and GSS refused (no TLS here), then the startup
            length = struct.unpack("!i", _read(self.client, 4))[0]
            body = _read(self.client, length - 4)
            code = struct.unpack("!i", body[:4])[0]
            if code in (_SSL, _GSS):
                self.client.sendall(b"N")
                continue
            self.server.sendall(struct.pack("!i", length) + body)
            if code == _CANCEL:
                return
            break
        threading.Thread(target=self._relay, daemon=True).start()
        while True:
            kind, body = _message(self.client)
            if kind == b"Q":
                text = body[:-1].decode("utf-8", "replace")
                copy = _COPY.match(text)
                if copy:
                    self._copy(text, copy)
                    continue
            self.server.sendall(_frame(kind, body))
            if kind == b"X":
                return

    def _relay(self) -> None:
        """The server's messages to the client, or to the session's own query."""
        with contextlib.suppress(OSError, ConnectionError):
            while True:
                message = _message(self.server)
                with self._divert_lock:
                    diverted = self.diverted
                if diverted is not None:
                    diverted.put(message)
                else:
                    self.client.sendall(_frame(*message))

    # -- COPY from S3 -------------------------------------------------------------------

    def _copy(self, text: str, copy: re.Match[str]) -> None:
        self.front.copies.append(text)
        with self._divert_lock:
            self.diverted = queue.Queue()
        try:
            try:
                rows = self._rows(copy)
            except Refused as refused:
                self._refuse(str(refused))
                return
            self._ask(b"Q", f"COPY {copy['table']} FROM STDIN (FORMAT csv)".encode() + b"\0")
            answer = self._answer(until=(b"G", b"Z"))
            if answer[-1][0] == b"G":  # the server takes the rows
                for start in range(0, len(rows), _CHUNK):
                    self.server.sendall(_frame(b"d", rows[start : start + _CHUNK]))
                self.server.sendall(_frame(b"c", b""))
                answer = self._answer(until=(b"Z",))
            for message in answer:
                if message[0] != b"G":
                    self.client.sendall(_frame(*message))
        finally:
            with self._divert_lock:
                self.diverted = None

    def _ask(self, kind: bytes, body: bytes) -> None:
        self.server.sendall(_frame(kind, body))

    def _answer(self, until: tuple[bytes, ...]) -> list[tuple[bytes, bytes]]:
        assert self.diverted is not None
        messages = []
        while True:
            message = self.diverted.get(timeout=120)
            messages.append(message)
            if message[0] in until:
                return messages

    def _refuse(self, why: str) -> None:
        """Redshift's refusal, raised in the client's session (its transaction aborted as
        Redshift's would be), the answer passed on to the client."""
        literal = "'" + why.replace("'", "''") + "'"
        with self._divert_lock:
            self.diverted = None
        self._ask(b"Q", (f"DO $$BEGIN RAISE EXCEPTION USING MESSAGE = {literal}, "
                         "ERRCODE = 'XX000'; END$$").encode() + b"\0")  # fmt: skip

    def _columns(self, table: str) -> list[tuple[str, str]]:
        literal = "'" + table.replace("'", "''") + "'"
        self._ask(b"Q", (
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
            f"WHERE a.attrelid = {literal}::regclass AND a.attnum > 0 "
            "AND NOT a.attisdropped ORDER BY a.attnum").encode() + b"\0")  # fmt: skip
        answer = self._answer(until=(b"Z",))
        errors = [body for kind, body in answer if kind == b"E"]
        if errors:
            raise Refused(_error_text(errors[0]))
        return [_data_row(body) for kind, body in answer if kind == b"D"]  # type: ignore[misc]

    def _rows(self, copy: re.Match[str]) -> bytes:
        """The CSV of every file under the prefix, checked as Redshift checks them."""
        import pyarrow as pa
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq

        options = copy["options"]
        if not _ROLE.search(options):
            raise Refused("Invalid credentials. Must be of the format: IAM_ROLE "
                          "'arn:aws:iam::<account>:role/<name>' or default")  # fmt: skip
        if not re.search(r"\bFORMAT\s+(AS\s+)?PARQUET\b", options, re.IGNORECASE):
            raise Refused("the stand-in takes COPY ... FORMAT AS PARQUET only")
        columns = self._columns(copy["table"])
        bucket, _, prefix = copy["uri"].removeprefix("s3://").partition("/")
        s3 = self.front.s3_client()
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
        keys = sorted(o["Key"] for o in listed if not o["Key"].endswith("/"))
        if not keys:
            raise Refused(f"The specified S3 prefix '{prefix}' does not exist")
        out = io.BytesIO()
        for key in keys:
            body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            table = pq.read_table(pa.BufferReader(body))
            if table.num_columns != len(columns):
                raise Refused(f"Spectrum Scan Error: file 's3://{bucket}/{key}': unmatched "
                              f"number of columns between table and file. Table columns: "
                              f"{len(columns)}, Data columns: {table.num_columns}")  # fmt: skip
            for (name, sql_type), field, values in zip(
                columns, table.schema, table.columns, strict=True
            ):
                why = _mismatch(sql_type, field.type, values)
                if why:
                    raise Refused(
                        f"Spectrum Scan Error: file 's3://{bucket}/{key}' has an incompatible "
                        f"Parquet schema for column '{name}'. Column type: {sql_type}, "
                        f"Parquet schema: {field.type}. {why}"
                    )
            pacsv.write_csv(table, out, pacsv.WriteOptions(include_header=False))
        return out.getvalue()


def _mismatch(sql_type: str, parquet: Any, values: Any) -> str:
    """Why Redshift's Parquet reader would not put ``parquet`` values into a column of
    ``sql_type`` (empty: it would)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_null(parquet):
        return ""
    if sql_type.startswith("character varying") or sql_type == "text":
        if not pa.types.is_string(parquet) and not pa.types.is_large_string(parquet):
            return "a text column takes text"
        cap = re.search(r"\((\d+)\)", sql_type)
        longest = pc.max(pc.binary_length(values)).as_py() if len(values) else None
        if cap and longest is not None and longest > int(cap.group(1)):
            return (f"The length of the data column is longer than the length defined in "
                    f"the table. Table: {cap.group(1)}, Data: {longest}")  # fmt: skip
        return ""
    allowed = {
        "bigint": pa.types.is_int64(parquet) or pa.types.is_int32(parquet),
        "integer": pa.types.is_int32(parquet),
        "double precision": pa.types.is_float64(parquet),
        "real": pa.types.is_float32(parquet),
        "boolean": pa.types.is_boolean(parquet),
        "timestamp without time zone": pa.types.is_timestamp(parquet) and parquet.tz is None,
        "timestamp with time zone": pa.types.is_timestamp(parquet) and parquet.tz is not None,
    }
    if sql_type.startswith("numeric"):
        return "" if (pa.types.is_decimal(parquet)
                      and sql_type == f"numeric({parquet.precision},{parquet.scale})") else (
            "a numeric column takes a decimal of its precision and scale")  # fmt: skip
    return "" if allowed.get(sql_type, False) else "the types do not match"


def _read(sock: socket.socket, count: int) -> bytes:
    chunks, left = [], count
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _message(sock: socket.socket) -> tuple[bytes, bytes]:
    kind = _read(sock, 1)
    length = struct.unpack("!i", _read(sock, 4))[0]
    return kind, _read(sock, length - 4)


def _frame(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def _error_text(body: bytes) -> str:
    fields = {part[:1]: part[1:].decode("utf-8", "replace") for part in body.split(b"\0") if part}
    return fields.get(b"M", "error")


def _data_row(body: bytes) -> tuple[str | None, ...]:
    (count,) = struct.unpack("!h", body[:2])
    values, at = [], 2
    for _ in range(count):
        (length,) = struct.unpack("!i", body[at : at + 4])
        at += 4
        if length < 0:
            values.append(None)
            continue
        values.append(body[at : at + length].decode())
        at += length
    return tuple(values)
