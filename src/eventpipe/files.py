"""Durable files: the one way eventpipe writes a file that a crash must leave whole or
absent, and appends that must survive one.

A file is written under a hidden temporary name beside its own (``.<name>.partial``),
flushed to disk, renamed onto its name, and the directory is flushed too: after a crash
of the process or the machine, the file is either the old one (or absent) or the whole
new one, never a part. A block that raises leaves nothing behind. Appends are flushed
before they return (failed/ records, which are acknowledged events).

Objects in a Hadoop FileSystem (``destinations/storage.HadoopStorage``) are written by
their own client; everything on local disk goes through here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, BinaryIO


def fsync_directory(directory: Path) -> None:
    """Make a rename or a new file in ``directory`` durable (fsync of the directory)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temporary_name(path: Path) -> Path:
    """Where ``path`` is written before it is renamed onto its name."""
    return path.with_name(f".{path.name}.partial")


class KeepOld(Exception):
    """Raised inside a :func:`replacing` block that found nothing to change: the
    temporary file is removed and ``path`` stays as it was."""


@contextmanager
def replacing_path(path: Path) -> Iterator[Path]:
    """A temporary path for a writer that opens files itself (Parquet, gzip, LZ4):
    what it wrote there becomes ``path`` durably when the block ends without error
    (KeepOld: it is dropped and ``path`` left as it was)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = temporary_name(path)
    try:
        yield partial
        with partial.open("rb") as written:
            os.fsync(written.fileno())
        os.replace(partial, path)
    except KeepOld:
        partial.unlink(missing_ok=True)
        return
    except BaseException:
        with suppress(FileNotFoundError):
            partial.unlink()
        raise
    fsync_directory(path.parent)


@contextmanager
def replacing(path: Path, *, private: bool = False) -> Iterator[BinaryIO]:
    """A binary file whose content becomes ``path`` durably when the block ends without
    error. ``private``: readable by its owner only (secrets)."""
    with replacing_path(path) as partial:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o666)
        with os.fdopen(fd, "wb") as out:
            yield out
            out.flush()


def write_file(path: Path, data: bytes | str, *, private: bool = False) -> None:
    """``path`` holds ``data`` (text as UTF-8), whole, durably."""
    with replacing(path, private=private) as out:
        out.write(data.encode() if isinstance(data, str) else data)


def append_file(path: Path, data: bytes) -> None:
    """``data`` at the end of ``path`` (created if missing), on disk when this returns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    created = not path.exists()
    with path.open("ab") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    if created:
        fsync_directory(path.parent)


def json_lines(path: Path) -> Iterator[tuple[bytes, Any]]:
    """Each line of a file of JSON lines (ending with its line break), with its value;
    a line that is not JSON (cut short by a crash, edited by hand) is passed over."""
    import orjson

    with path.open("rb") as lines:
        for line in lines:
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            yield (line if line.endswith(b"\n") else line + b"\n"), value


def move(source: Path, target: Path) -> None:
    """Rename ``source`` to ``target`` (replacing it), durably: both directories are
    flushed (the name leaves one and enters the other)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(source, target)
    fsync_directory(target.parent)
    if source.parent.resolve() != target.parent.resolve():
        fsync_directory(source.parent)
