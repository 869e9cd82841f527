"""Today's ClickHouse engine behind ClickHouse's HTTP interface, for the tests: chDB
(``chdb-core`` on PyPI, the current engine in-process) served by a small HTTP server in a
process of its own, so that the ClickHouse destination runs unchanged against the
version-dependent paths that Debian's 18.16 server lacks (``DateTime64``, today's
``ReplacingMergeTree``, error texts and HTTP statuses).

What it serves, as the real interface does: ``POST /?database=D&query=Q`` with the rows
as the body (``INSERT ... FORMAT Native``), or the statement as the body; settings as
URL parameters; the user and password in ``X-ClickHouse-User`` / ``X-ClickHouse-Key``
(two users: ``default`` and ``reader``, in a read-only profile); errors as ClickHouse's
text (``Code: N. DB::Exception: ...``) with the HTTP status the server gives that code
(ClickHouse's ``exceptionCodeToHTTPStatus``). Read-only is applied as the server does
for a ``readonly=1`` profile: only reads run, and no setting can be changed.

Run: ``python -m tests.chdb_server PORT PASSWORD DIRECTORY``; :class:`ChdbServer` starts
and stops one.
"""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from tests.process import free_port, stop, wait_answering

STATUS_OF_CODE = {
    194: 401,  # REQUIRED_PASSWORD
    192: 403, 193: 403, 516: 403, 497: 403,  # UNKNOWN_USER, WRONG_PASSWORD, ..., ACCESS_DENIED
    62: 400, 53: 400, 6: 400, 27: 400, 36: 400, 69: 400, 70: 400, 117: 400,
    60: 404, 46: 404, 47: 404, 81: 404, 115: 404, 73: 404,
    159: 408, 209: 503, 439: 503,
}  # fmt: skip
"""HTTP statuses of the codes ClickHouse maps (the rest: 500)."""

READS = re.compile(r"^\s*(SELECT|WITH|SHOW|DESCRIBE|DESC|EXISTS|EXPLAIN)\b", re.IGNORECASE)
_CODE = re.compile(r"Code:\s*(\d+)")


def serve(port: int, password: str, directory: Path) -> None:
    import chdb
    from chdb import session

    engine = session.Session(str(directory / "engine"))
    lock = threading.Lock()  # one statement at a time, as chDB takes them
    spool = directory / "spool"
    spool.mkdir(exist_ok=True)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # /ping
            self._reply(200, b"Ok.\n")

        def do_POST(self) -> None:
            params = dict(parse_qsl(urlsplit(self.path).query))
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            user = self.headers.get("X-ClickHouse-User", "default")
            if (
                user not in ("default", "reader")
                or self.headers.get("X-ClickHouse-Key") != password
            ):
                return self._error(
                    f"Code: 516. DB::Exception: {user}: Authentication failed: password is "
                    "incorrect, or there is no user with such name. (AUTHENTICATION_FAILED)"
                )
            database = params.pop("database", "default")
            sql = params.pop("query", None)
            data = None
            if sql is None:
                sql = body.decode()
            else:
                data = body
            if user == "reader" and params:
                name = next(iter(params))
                return self._error(
                    f"Code: 164. DB::Exception: Cannot modify '{name}' setting in readonly "
                    "mode. (READONLY)"
                )
            readonly = user == "reader" or params.get("readonly") == "1"
            if readonly and not READS.match(sql):
                return self._error(
                    "Code: 164. DB::Exception: Cannot execute query in readonly mode. (READONLY)"
                )
            with lock:
                try:
                    result = self._run(sql, data, database, params)
                except chdb.ChdbError as exc:
                    return self._error(str(exc))
            self._reply(200, result)

        def _run(
            self, sql: str, data: bytes | None, database: str, settings: dict[str, str]
        ) -> bytes:
            engine.query(f"USE `{database}`")
            if data is not None:
                rows = spool / secrets.token_hex(8)
                rows.write_bytes(data)
                try:
                    source = f"SELECT * FROM file('{rows}', 'Native')"
                    sql = re.sub(r"FORMAT\s+Native\s*$", source, sql.strip())
                    return bytes(engine.query(sql).bytes() or b"")
                finally:
                    rows.unlink()
            if settings:
                listed = ", ".join(f"{k} = {v}" for k, v in settings.items())
                head, found, tail = sql.rpartition("\nFORMAT ")
                sql = (
                    f"{head} SETTINGS {listed}\nFORMAT {tail}"
                    if found
                    else f"{sql} SETTINGS {listed}"
                )
            return bytes(engine.query(sql, "TabSeparated").bytes() or b"")

        def _error(self, text: str) -> None:
            found = _CODE.search(text)
            status = STATUS_OF_CODE.get(int(found.group(1)), 500) if found else 500
            self._reply(status, text.encode())

        def _reply(self, status: int, content: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


class ChdbServer:
    """One served chDB engine in a temporary directory; ``remove()`` at the end."""

    user = "default"
    cluster: str | None = None

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="eventpipe-chdb-"))
        self.http_port = free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.password = secrets.token_hex(12)
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        root = Path(__file__).resolve().parents[1]
        with (self.root / "server.log").open("ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tests.chdb_server", str(self.http_port), self.password,
                 str(self.root)], stdout=log, stderr=log, cwd=root,
            )  # fmt: skip
        wait_answering(self._process, self.url + "/ping", "chdb server",
                       self.root / "server.log", timeout)  # fmt: skip

    def remove(self) -> None:
        stop(self._process)
        shutil.rmtree(self.root, ignore_errors=True)


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
