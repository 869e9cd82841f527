"""A throwaway stand-in for S3 in the tests: moto's server mode (``moto_server``), a real
HTTP server on a free port of 127.0.0.1 that answers S3's REST API (buckets, objects,
listings, multipart uploads, conditional writes) from memory. eventpipe reaches it as it
reaches MinIO or R2: ``s3.endpoint``. What moto does not do as S3 does is said in
docs/lakehouse.md.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from eventpipe.objectstore import Location
from tests.process import free_port, stop, wait_answering

REGION = "us-east-1"
ACCESS_KEY = "eventpipe-test-key"
SECRET_KEY = "eventpipe-test-secret"  # moto takes any


class S3Server:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="eventpipe-s3-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None
        self._buckets = itertools.count()

    def settings(self) -> dict[str, str]:
        """A destination's ``s3:`` keys for this server."""
        return {"endpoint": self.url, "region": REGION, "access_key_id": ACCESS_KEY,
                "secret_access_key": SECRET_KEY}  # fmt: skip

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.url, region_name=REGION,
                            aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY)  # fmt: skip

    def bucket(self) -> str:
        """A new, empty bucket."""
        name = f"lake-{next(self._buckets)}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def start(self, timeout: float = 60.0) -> None:
        moto = Path(sys.executable).with_name("moto_server")
        log = self.root / "server.log"
        with log.open("ab") as out:
            self._process = subprocess.Popen(
                [str(moto), "-H", "127.0.0.1", "-p", str(self.port)], stdout=out, stderr=out,
                cwd=self.root,
            )  # fmt: skip
        wait_answering(self._process, self.url, "moto_server", log, timeout)

    def remove(self) -> None:
        stop(self._process, timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)


def open_lake(kind: str, where: Location, tmp_path: Path, dest_id: str = "lake") -> Any:
    """A ``kind`` lake (parquet, iceberg, delta) at ``where``: its locks, work directory
    and Iceberg catalog (SQLite) under ``tmp_path``."""
    from eventpipe.destinations.delta import DeltaDestination
    from eventpipe.destinations.iceberg import IcebergDestination
    from eventpipe.destinations.parquet_s3 import S3ParquetDestination
    from eventpipe.locks import FileLocks

    locks = FileLocks(tmp_path / "locks")
    if kind == "parquet":
        return S3ParquetDestination(dest_id, where, locks, tmp_path / "work")
    if kind == "iceberg":
        catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}"}
        return IcebergDestination(dest_id, where, locks, catalog, dest_id)
    return DeltaDestination(dest_id, where, locks)
