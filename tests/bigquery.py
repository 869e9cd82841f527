"""A throwaway stand-in for BigQuery in the tests: bqemulator (PyPI: BigQuery's REST API
with DuckDB behind it), in a virtualenv of its own (``make bigquery``), started by
tests/bigquery_emulator.py on free ports of 127.0.0.1 and reached by the official client
as BigQuery is, through ``endpoint``. It holds its datasets in memory. What it does not
do as BigQuery does is said in docs/destinations.md.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.process import free_port, stop, wait_answering

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ROOT / ".venv-bigquery" / "bin" / "python"
PROJECT = "eventpipe-test"


class BigQueryServer:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="eventpipe-bq-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.grpc_port = free_port()
        """The Storage Write API's port (gRPC, plaintext)."""
        self._process: subprocess.Popen[bytes] | None = None
        self._datasets = itertools.count()

    def settings(self, dataset: str) -> dict[str, object]:
        """A ``type: bigquery`` destination's settings on this server."""
        storage = f"127.0.0.1:{self.grpc_port}"
        return {"type": "bigquery", "project": PROJECT, "dataset": dataset,
                "endpoint": self.url, "storage_endpoint": storage}  # fmt: skip

    def dataset(self) -> str:
        """A name for a dataset of its own (the destination creates it)."""
        return f"events_{next(self._datasets)}"

    def start(self, timeout: float = 90.0) -> None:
        if not PYTHON.exists():
            raise RuntimeError(f"{PYTHON} is missing: `make bigquery` installs bqemulator")
        log = self.root / "server.log"
        with log.open("ab") as out:
            self._process = subprocess.Popen(
                [str(PYTHON), str(ROOT / "tests" / "bigquery_emulator.py"), "--project", PROJECT,
                 "--rest-port", str(self.port), "--grpc-port", str(self.grpc_port),
                 "--log-level", "warning"],
                stdout=out, stderr=out, cwd=self.root, env={"HOME": str(self.root), "PATH": ""},
            )  # fmt: skip
        wait_answering(self._process, f"{self.url}/bigquery/v2/projects/{PROJECT}/datasets",
                       "bqemulator", log, timeout)  # fmt: skip

    def remove(self) -> None:
        stop(self._process, timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)
