"""Where file destinations keep their files: a local directory; an S3 prefix
(``s3://``) through pyarrow's S3 filesystem (eventpipe.objectstore); or any
Hadoop-compatible URI (``hdfs://``, ``s3a://``, ``abfss://``, ``gs://``, ``file://``)
through the Hadoop FileSystem of the Spark session, with whatever credentials
``spark.hadoop.*`` gives it.

Paths are ``/``-joined text under the root. The operations are the few a file destination
needs to move a batch into place atomically: new files are written whole under a hidden
name and renamed, and nothing is ever overwritten in place (object stores cannot do that
atomically; HDFS and local files can, but one rule for all is simpler to trust).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from eventpipe.files import move, write_file
from eventpipe.objectstore import Location

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def join(*parts: str) -> str:
    return "/".join(p.strip("/") if i else p.rstrip("/") for i, p in enumerate(parts))


class Storage(Protocol):
    root: str

    def read_text(self, path: str) -> str | None:
        """The file's text, or None if it does not exist."""
        ...

    def create_text(self, path: str, text: str) -> None:
        """Write a new file whole: readers see all of it or none of it."""
        ...

    def names(self, directory: str) -> list[str]:
        """Names of the entries of ``directory`` (none if it does not exist)."""
        ...

    def files(self, directory: str, suffix: str) -> list[str]:
        """Paths, relative to ``directory``, of the files below it ending in ``suffix``."""
        ...

    def move(self, source: str, target: str) -> None:
        """Rename a file, creating the target's directory; durable when this returns."""
        ...

    def delete(self, path: str) -> None:
        """Remove a file or a directory tree; nothing if it does not exist."""
        ...


class LocalStorage:
    def __init__(self, root: Path) -> None:
        self.root = str(root)

    def read_text(self, path: str) -> str | None:
        try:
            return Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def create_text(self, path: str, text: str) -> None:
        write_file(Path(path), text)

    def names(self, directory: str) -> list[str]:
        try:
            return sorted(os.listdir(directory))
        except FileNotFoundError:
            return []

    def files(self, directory: str, suffix: str) -> list[str]:
        base = Path(directory)
        return sorted(str(f.relative_to(base)) for f in base.rglob(f"*{suffix}") if f.is_file())

    def move(self, source: str, target: str) -> None:
        move(Path(source), Path(target))

    def delete(self, path: str) -> None:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)


class HadoopStorage:
    """Files through ``org.apache.hadoop.fs.FileSystem``, called over Py4J on the driver.

    A rename is atomic on HDFS and local files; on object stores (S3A, GCS) it is a copy,
    so each file still appears whole, but a directory's files appear one by one.
    """

    def __init__(self, spark: SparkSession, root: str) -> None:
        self.root = root.rstrip("/")
        self._jvm: Any = spark.sparkContext._jvm
        self._fs: Any = self._path(self.root).getFileSystem(
            spark.sparkContext._jsc.hadoopConfiguration()
        )

    def _path(self, path: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(path)

    def read_text(self, path: str) -> str | None:
        location = self._path(path)
        if not self._fs.exists(location):
            return None
        stream = self._fs.open(location)
        try:
            return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def create_text(self, path: str, text: str) -> None:
        directory, name = path.rsplit("/", 1)
        partial = self._path(f"{directory}/.{name}.partial")
        out = self._fs.create(partial, True)
        try:
            out.write(bytearray(text.encode("utf-8")))
            out.hsync()
        finally:
            out.close()
        self._rename(partial, self._path(path))

    def names(self, directory: str) -> list[str]:
        location = self._path(directory)
        if not self._fs.exists(location):
            return []
        return sorted(str(s.getPath().getName()) for s in self._fs.listStatus(location))

    def files(self, directory: str, suffix: str) -> list[str]:
        location = self._path(directory)
        if not self._fs.exists(location):
            return []
        base = str(self._fs.makeQualified(location).toString()).rstrip("/") + "/"
        found, listing = [], self._fs.listFiles(location, True)
        while listing.hasNext():
            path = str(listing.next().getPath().toString())
            if path.endswith(suffix):
                found.append(path.removeprefix(base))
        return sorted(found)

    def move(self, source: str, target: str) -> None:
        self._fs.mkdirs(self._path(target).getParent())
        self._rename(self._path(source), self._path(target))

    def _rename(self, source: Any, target: Any) -> None:
        # FileSystem.rename does not replace an existing file on HDFS: the target is
        # removed first. Callers hold the table's lock, and a crash in between leaves the
        # source in place, from which the caller's retry starts again.
        self._fs.delete(target, False)
        if not self._fs.rename(source, target):
            raise OSError(f"could not rename {source.toString()} to {target.toString()}")

    def delete(self, path: str) -> None:
        self._fs.delete(self._path(path), True)


class ObjectStorage:
    """Objects under an S3 prefix, through pyarrow's S3 filesystem. Each object is written
    by one PUT, so it appears whole; there is no rename: a move is a copy then a delete
    (of each object under a prefix, one by one), so callers never rely on a move being
    atomic. Paths are ``s3://bucket/key`` text."""

    def __init__(self, location: Location) -> None:
        self.root = location.uri
        self._location = location
        self._fs: Any = location.filesystem()

    def _at(self, path: str) -> str:
        return self._location.fs_path(path)

    def read_text(self, path: str) -> str | None:
        try:
            with self._fs.open_input_stream(self._at(path)) as stream:
                return bytes(stream.read()).decode("utf-8")
        except FileNotFoundError:
            return None

    def create_text(self, path: str, text: str) -> None:
        with self._fs.open_output_stream(self._at(path)) as out:
            out.write(text.encode("utf-8"))

    def upload(self, local: Path, path: str) -> None:
        """A local file as the object ``path`` (one PUT, or a multipart upload that
        completes at once)."""
        import pyarrow.fs as pafs

        pafs.copy_files(str(local), self._at(path), destination_filesystem=self._fs)

    def _entries(self, directory: str, recursive: bool) -> list[Any]:
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self._at(directory), recursive=recursive,
                                     allow_not_found=True)  # fmt: skip
        return list(self._fs.get_file_info(selector))

    def names(self, directory: str) -> list[str]:
        return sorted(e.base_name for e in self._entries(directory, recursive=False))

    def files(self, directory: str, suffix: str) -> list[str]:
        import pyarrow.fs as pafs

        base = self._at(directory).rstrip("/") + "/"
        return sorted(
            e.path.removeprefix(base)
            for e in self._entries(directory, recursive=True)
            if e.type == pafs.FileType.File and e.path.endswith(suffix)
        )

    def move(self, source: str, target: str) -> None:
        import pyarrow.fs as pafs

        if self._fs.get_file_info(self._at(source)).type == pafs.FileType.File:
            self._fs.move(self._at(source), self._at(target))  # copy, then delete
            return
        for name in self.files(source, ""):
            self._fs.move(self._at(join(source, name)), self._at(join(target, name)))

    def delete(self, path: str) -> None:
        import pyarrow.fs as pafs

        kind = self._fs.get_file_info(self._at(path)).type
        if kind == pafs.FileType.File:
            self._fs.delete_file(self._at(path))
        elif kind == pafs.FileType.Directory:
            self._fs.delete_dir(self._at(path))
