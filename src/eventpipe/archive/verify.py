"""``eventpipe archive verify``: recompute every size and checksum of the archive and name
each file and frame that does not match what was recorded when it was written."""

from __future__ import annotations

import gzip
import io
import sys
import zlib
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import lz4.frame

from eventpipe.archive.files import (
    SUFFIX,
    ArchivedSegment,
    ArchiveFormatError,
    Checksums,
    Index,
    Manifest,
    day_dirs,
    id_hashes,
    segments_of_day,
    split_lines,
)
from eventpipe.archive.remote import RemoteArchive
from eventpipe.archive.write import Digest, digest
from eventpipe.paths import DataLayout


@dataclass(frozen=True)
class Problem:
    path: Path
    message: str

    def __str__(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}: {self.message}"


@dataclass
class VerifyReport:
    days: int = 0
    files: int = 0
    frames: int = 0
    events: int = 0
    compressed_bytes: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(
    layout: DataLayout,
    first: date | None = None,
    last: date | None = None,
    progress: Callable[[Path], None] | None = None,
) -> VerifyReport:
    """Verify the archive's days ``first``..``last`` (None: unbounded); ``progress`` is
    called with each file before it is read."""
    report = VerifyReport()
    for day in day_dirs(layout, first, last):
        report.days += 1
        segments = list(segments_of_day(day))
        archived = {s.data for s in segments}
        for segment in segments:
            if progress:
                progress(segment.data)
            report.files += 1
            report.compressed_bytes += segment.data.stat().st_size
            if segment.legacy:
                _verify_gzip(segment, report)
            else:
                _Segment(segment, report).verify()
        for path in sorted(day.iterdir()):
            owner = _owner(path)
            if owner is not None and owner not in archived:
                report.problems.append(Problem(path, f"{owner.name} is missing"))
    return report


def verify_remote(
    layout: DataLayout, remote: RemoteArchive, first: date | None = None, last: date | None = None
) -> VerifyReport:
    """Verify the archive's remote copy of ``first``..``last`` as :func:`verify` does the
    disk (each day downloaded to a temporary directory under ``tmp/``), and name the
    segments on disk that the copy lacks."""
    import tempfile

    report = VerifyReport()
    layout.tmp.mkdir(parents=True, exist_ok=True)
    held: dict[str, set[str]] = {}
    for day in remote.days(first, last):
        with tempfile.TemporaryDirectory(prefix="archive-verify-", dir=layout.tmp) as tmp:
            copy = DataLayout(Path(tmp))
            remote.download_day(day, copy.archive)
            held[day] = {s.data.name for s in segments_of_day(copy.archive / day)}
            one = verify(copy, date.fromisoformat(day), date.fromisoformat(day))
        report.days += one.days
        report.files += one.files
        report.frames += one.frames
        report.events += one.events
        report.compressed_bytes += one.compressed_bytes
        report.problems += one.problems
    for on_disk in day_dirs(layout, first, last):
        for segment in segments_of_day(on_disk):
            if segment.data.name not in held.get(on_disk.name, set()):
                report.problems.append(Problem(segment.data, f"not on {remote.location} "
                                               "(uploaded after the next run)"))  # fmt: skip
    return report


def _owner(path: Path) -> Path | None:
    """The ``.lz4`` file a sidecar belongs to (None: not a sidecar)."""
    for ending in (".index.json", ".ids", ".manifest.json"):
        if path.name.endswith(SUFFIX + ending):
            return path.with_name(path.name.removesuffix(ending))
    return None


def _verify_gzip(segment: ArchivedSegment, report: VerifyReport) -> None:
    """A legacy archive file: gzip's own CRC32 and size, checked by reading it through."""
    try:
        with gzip.open(segment.data, "rb") as stream:
            report.events += sum(1 for _ in stream)
    except (OSError, EOFError, zlib.error) as exc:
        report.problems.append(Problem(segment.data, f"gzip: {exc}"))


class _Segment:
    """The checks of one archived segment, each problem recorded where it is found."""

    def __init__(self, segment: ArchivedSegment, report: VerifyReport) -> None:
        self.segment = segment
        self.report = report

    def problem(self, path: Path, message: str) -> None:
        self.report.problems.append(Problem(path, message))

    def verify(self) -> None:
        manifest = self._manifest()
        index_bytes = self._sidecar(self.segment.index, manifest.index if manifest else None)
        ids = self._sidecar(self.segment.ids, manifest.ids if manifest else None)
        data = self.segment.data.read_bytes()
        if manifest:
            self._compare(self.segment.data, "", digest(data), manifest.compressed)
        index = None
        if index_bytes is not None:
            try:
                index = Index.from_json(index_bytes)
            except ArchiveFormatError as exc:
                self.problem(self.segment.index, str(exc))
        if index is None:
            raw, hashes = self._whole(data)
        else:
            raw, hashes = self._frames(data, index)
        if raw is None:
            return
        self.report.events += len(hashes)
        if manifest:
            self._compare(self.segment.data, "uncompressed data: ", raw, manifest.uncompressed)
            if manifest.events != len(hashes):
                self.problem(
                    self.segment.manifest,
                    f"says {manifest.events} events; the file holds {len(hashes)}",
                )
        if ids is not None:
            self._ids(ids, hashes)

    def _manifest(self) -> Manifest | None:
        try:
            return Manifest.read(self.segment.manifest)
        except FileNotFoundError:
            self.problem(self.segment.manifest, "missing")
        except ArchiveFormatError as exc:
            self.problem(self.segment.manifest, str(exc))
        return None

    def _sidecar(self, path: Path, recorded: Checksums | None) -> bytes | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            self.problem(path, "missing")
            return None
        if recorded:
            self._compare(path, "", digest(data), recorded)
        return data

    def _compare(self, path: Path, what: str, found: Checksums, recorded: Checksums) -> None:
        for name in ("size", "sha1", "crc32"):
            mine, theirs = getattr(found, name), getattr(recorded, name)
            if mine != theirs:
                self.problem(path, f"{what}{name} is {mine}; the manifest says {theirs}")

    def _whole(self, data: bytes) -> tuple[Checksums | None, array[int]]:
        """Without an index: the file (``data``, read once) decompressed as one stream of
        frames."""
        try:
            with lz4.frame.open(io.BytesIO(data), "rb") as stream:
                raw = stream.read()
        except (RuntimeError, EOFError) as exc:
            self.problem(self.segment.data, f"cannot be decompressed: {exc}")
            return None, array("I")
        return digest(raw), array("I", id_hashes(raw, split_lines(raw)))

    def _frames(self, data: bytes, index: Index) -> tuple[Checksums | None, array[int]]:
        """Each frame checked against its index entry. A frame that cannot be read makes
        the totals (uncompressed checksums, event counts, ids) unknowable: they are not
        compared, since they would only repeat that frame's problem elsewhere."""
        raw = Digest()
        hashes = array("I")
        end = first = 0
        readable = True
        for number, frame in enumerate(index.frames):
            self.report.frames += 1
            where = frame.describe(number)
            if frame.offset != end:
                self.problem(self.segment.index, f"{where} starts at {frame.offset}, not {end}")
            end = frame.offset + frame.size
            if end > len(data):
                self.problem(
                    self.segment.data,
                    f"{where}: the file ends at byte {len(data)} (truncated)",
                )
                return None, hashes
            compressed = data[frame.offset : end]
            if zlib.crc32(compressed) != frame.crc32:
                self.problem(
                    self.segment.data,
                    f"{where}: crc32 is {zlib.crc32(compressed):08x}; "
                    f"the index says {frame.crc32:08x}",
                )
            try:
                events = lz4.frame.decompress(compressed)
            except RuntimeError as exc:
                self.problem(self.segment.data, f"{where}: cannot be decompressed: {exc}")
                readable = False
                first += frame.events
                continue
            if zlib.crc32(events) != frame.raw_crc32 or len(events) != frame.raw_size:
                self.problem(self.segment.data, f"{where}: its events differ from the index's")
            frame_lines = split_lines(events)
            if len(frame_lines) != frame.events or frame.first != first:
                self.problem(
                    self.segment.index,
                    f"{where}: holds {len(frame_lines)} events from line {first}",
                )
            first += len(frame_lines)
            raw.update(events)
            hashes.extend(id_hashes(events, frame_lines))
        if end != len(data):
            self.problem(
                self.segment.data, f"{len(data) - end} byte(s) after the last frame of the index"
            )
        if not readable:
            return None, hashes
        if index.events != len(hashes):
            self.problem(
                self.segment.index, f"says {index.events} events; its frames hold {len(hashes)}"
            )
        return raw.sums(), hashes

    def _ids(self, ids: bytes, expected: array[int]) -> None:
        stored = array("I")
        stored.frombytes(ids[: len(ids) - len(ids) % 4])
        if sys.byteorder == "big":
            stored.byteswap()  # the file is little-endian
        if len(stored) != len(expected) or stored != expected:
            wrong = next(
                (n for n, (a, b) in enumerate(zip(stored, expected, strict=False)) if a != b),
                min(len(stored), len(expected)),
            )
            self.problem(self.segment.ids, f"does not match the events from line {wrong} on")
