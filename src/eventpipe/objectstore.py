"""Where a lake lives: a local directory, or a prefix of an S3-compatible object store
(AWS S3, MinIO, Cloudflare R2, Ceph...) reached by eventpipe's own clients: pyarrow's
S3 filesystem, delta-rs and pyiceberg each speak S3 themselves, so nothing goes through
Spark's Hadoop connector (whose jars would be downloaded at run time).

An S3 location is ``s3://bucket/prefix``. How it is reached (:class:`S3Settings`) comes
from the destination's ``s3:`` keys, else from the standard AWS variables of the
environment (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``...), else from
each library's default chain (profiles, instance metadata). The credentials are handed to
the libraries in memory: never logged, never written (an Iceberg catalog stores table
locations, not how to reach them).

Object stores have no rename: what eventpipe writes there appears whole because each
object is one PUT, and a table's state changes in one step because the formats commit by
writing one new object (Delta's log entry, put only if absent; Iceberg's metadata,
swapped in the catalog).
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

SCHEME = "s3://"


def is_s3(location: str | Path) -> bool:
    return str(location).startswith(SCHEME)


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` as ``("bucket", "a/b")``."""
    bucket, _, key = uri.removeprefix(SCHEME).partition("/")
    return bucket, key.strip("/")


def check_s3_uri(uri: str) -> str:
    """``uri`` if it names a bucket (and maybe a prefix), else ValueError saying why."""
    bucket, key = split_s3(uri)
    if not bucket or any(not part or part in (".", "..") for part in key.split("/") if key):
        raise ValueError(f"{uri!r}: write s3://bucket or s3://bucket/prefix")
    return uri


@dataclass(frozen=True)
class S3Settings:
    """How to reach an S3-compatible store. Unset values come from the environment, then
    from each library's own defaults."""

    endpoint: str | None = None
    """``http(s)://host:port`` of a store other than AWS S3 (MinIO, R2, Ceph)."""
    region: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)

    def resolved(self) -> S3Settings:
        """These settings, each unset one from the standard AWS environment variable."""
        env = os.environ.get
        return S3Settings(
            endpoint=self.endpoint or env("AWS_ENDPOINT_URL_S3") or env("AWS_ENDPOINT_URL"),
            region=self.region or env("AWS_REGION") or env("AWS_DEFAULT_REGION"),
            access_key_id=self.access_key_id or env("AWS_ACCESS_KEY_ID"),
            secret_access_key=self.secret_access_key or env("AWS_SECRET_ACCESS_KEY"),
            session_token=self.session_token or env("AWS_SESSION_TOKEN"),
        )

    def filesystem(self) -> Any:
        """pyarrow's S3 filesystem (paths ``bucket/key``), retrying throttled and failed
        requests with AWS's standard strategy."""
        import pyarrow.fs as pafs

        s = self.resolved()
        options: dict[str, Any] = {
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=5),
            "connect_timeout": 10,
            "request_timeout": 60,
        }
        if s.endpoint:
            scheme = urlsplit(s.endpoint).scheme or "https"
            options["endpoint_override"] = s.endpoint.split("://", 1)[-1]
            options["scheme"] = scheme
        if s.region:
            options["region"] = s.region
        if s.access_key_id and s.secret_access_key:
            options.update(access_key=s.access_key_id, secret_key=s.secret_access_key,
                           session_token=s.session_token)  # fmt: skip
        return pafs.S3FileSystem(**options)

    def delta_options(self) -> dict[str, str]:
        """delta-rs's storage options (object_store's AWS keys). delta-rs 1.x commits with
        S3's conditional writes (a log entry put only if absent): no lock table."""
        s = self.resolved()
        options: dict[str, str] = {}
        if s.endpoint:
            options["AWS_ENDPOINT_URL"] = s.endpoint
            if s.endpoint.startswith("http://"):
                options["AWS_ALLOW_HTTP"] = "true"
        for key, value in (("AWS_REGION", s.region), ("AWS_ACCESS_KEY_ID", s.access_key_id),
                           ("AWS_SECRET_ACCESS_KEY", s.secret_access_key),
                           ("AWS_SESSION_TOKEN", s.session_token)):  # fmt: skip
            if value:
                options[key] = value
        return options

    def iceberg_properties(self) -> dict[str, str]:
        """pyiceberg's FileIO properties (``s3.*``), for its pyarrow FileIO."""
        s = self.resolved()
        properties = {"py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"}
        for key, value in (("s3.endpoint", s.endpoint), ("s3.region", s.region),
                           ("s3.access-key-id", s.access_key_id),
                           ("s3.secret-access-key", s.secret_access_key),
                           ("s3.session-token", s.session_token)):  # fmt: skip
            if value:
                properties[key] = value
        return properties


@dataclass(frozen=True)
class Location:
    """A lake's root: a local directory, or ``s3://bucket/prefix`` with how to reach it."""

    uri: str
    """An absolute local path, or ``s3://bucket/prefix`` (no trailing ``/``)."""
    s3: S3Settings | None = None

    @classmethod
    def of(cls, root: str | Path, s3: S3Settings | None = None) -> Location:
        if is_s3(root):
            return cls(str(root).rstrip("/"), s3 or S3Settings())
        return cls(str(Path(root).absolute()))

    @property
    def remote(self) -> bool:
        return is_s3(self.uri)

    def join(self, *parts: str) -> str:
        """A path under the root, as the libraries take it (a local path or an s3:// URI)."""
        return posixpath.join(self.uri, *parts) if self.remote else str(Path(self.uri, *parts))

    def as_uri(self, *parts: str) -> str:
        """``file://...`` or ``s3://...``: how Iceberg records a location."""
        return self.join(*parts) if self.remote else Path(self.join(*parts)).as_uri()

    def filesystem(self) -> Any:
        """A pyarrow filesystem for :meth:`fs_path` paths."""
        import pyarrow.fs as pafs

        return self.s3.filesystem() if self.s3 is not None else pafs.LocalFileSystem()

    def fs_path(self, location: str) -> str:
        """A location under this root (local, ``file://`` or ``s3://``) as a path of
        :meth:`filesystem` (``bucket/key`` on S3)."""
        if self.remote:
            return location.removeprefix(SCHEME)
        return location.removeprefix("file://")

    def remove(self, location: str) -> None:
        """Delete the tree at ``location`` (under this root: a path, ``file://`` or
        ``s3://``); nothing if it is not there."""
        if not self.remote:
            import shutil

            shutil.rmtree(self.fs_path(location), ignore_errors=True)
            return
        import pyarrow.fs as pafs

        fs, path = self.filesystem(), self.fs_path(location)
        if fs.get_file_info(path).type != pafs.FileType.NotFound:
            fs.delete_dir(path)

    def delta_options(self) -> dict[str, str] | None:
        return self.s3.delta_options() if self.s3 is not None else None

    def __str__(self) -> str:
        return self.uri
