"""``eventpipe import``: events from files into the log, through the checks and the
enrichment of the HTTP collector, as the server events of one key.

* **Formats**: NDJSON (one event per line), a JSON array, CSV (a header row; a cell is a
  string, an empty cell is absent, a dotted header ``user.id`` makes a nested field);
  each plain, gzip (``.gz``) or zstd (``.zst``). Chosen by the name (``.csv``,
  ``.ndjson``/``.jsonl``, ``.json``: an array if it starts with ``[``, else NDJSON), or
  by ``--format``.
* **Bad input**: a line that is not JSON, not an object, too large or too deep is
  rejected alone, counted, and written to ``failed/`` with its line number; the rest of
  the file is imported.
* **Durable**: appended to the log as a writer of its own (``<host>-import``, one import
  per host at a time), fsynced every :data:`CHUNK` events; the segments are sealed when
  the import ends, for the pipeline's next run.
* **Idempotent**: an event without an id of its own gets one derived from its content
  (a UUIDv5 of the key, the event's canonical JSON and how many identical events came
  before it in the file), so the same file imported twice gives the same ids, which a
  destination with ``primary_key: [eventn_ctx_event_id]`` keeps once. And each file
  imported is recorded by its SHA-256 in ``data_dir/imports/``: importing it again is
  skipped at once (``--force`` imports it anyway).
"""

from __future__ import annotations

import asyncio
import csv
import gzip
import hashlib
import io
import re
import time
import uuid
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson
from starlette.requests import ClientDisconnect

from eventpipe.collector.body import BodyError, Deadline, gone, parse_events
from eventpipe.collector.enrich import (
    EnrichedBatch,
    EnrichSettings,
    RequestContext,
    enrich_batch,
    tracking_plans,
)
from eventpipe.collector.secrets import Scrubber
from eventpipe.config import Config
from eventpipe.errors import ConfigError
from eventpipe.events import format_timestamp, utc_now
from eventpipe.files import write_file
from eventpipe.log.segments import SegmentLog
from eventpipe.log.settings import LogSettings
from eventpipe.log.writers import host_id

FORMATS = ("ndjson", "json", "csv")
CHUNK = 10_000
"""Events enriched and appended (one fsync) at a time."""
IDS = uuid.UUID("5b3f0a52-0c1e-4f47-9a43-6f0d6c2a9e1d")
"""The namespace of the ids derived from events' content."""


@dataclass
class FileReport:
    path: Path
    events: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    broken: int = 0
    """Events that broke their tracking plan: imported, their lines marked with the
    verdict (each destination's ``on_violation`` decides)."""
    skipped: str | None = None
    """Why the file was not imported (already imported, when), if it was not."""


@dataclass(frozen=True)
class _Refused:
    reason: str
    message: str
    raw: str


def files_of(paths: list[Path]) -> list[Path]:
    """The files named, and the files under the directories named (sorted, hidden ones
    left out)."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p, path))
        elif path.is_file():
            found.append(path)
        else:
            raise ConfigError(f"{path}: no such file or directory")
    return found


def _hidden(path: Path, under: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(under).parts)


def format_of(path: Path, stream: io.BufferedReader) -> str:
    """The format of ``path`` by its name (its first bytes for ``.json``)."""
    name = path.name.lower().removesuffix(".gz").removesuffix(".zst")
    if name.endswith(".csv"):
        return "csv"
    if name.endswith(".json"):
        return "json" if stream.peek(64).lstrip()[:1] == b"[" else "ndjson"
    return "ndjson"


def decompressed(raw: IO[bytes], name: str) -> io.BufferedReader:
    """``raw`` (the file ``name``) decompressed as it is read: gzip, zstd, or plain.
    ``raw.tell()`` keeps saying how much of the file was read."""
    lowered = name.lower()
    if lowered.endswith(".gz"):
        return io.BufferedReader(gzip.GzipFile(fileobj=raw, mode="rb"))
    if lowered.endswith(".zst"):
        import zstandard  # zstd's reference binding (python-zstandard)

        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        return io.BufferedReader(reader)
    return io.BufferedReader(raw)  # type: ignore[arg-type]


def records(stream: IO[bytes], fmt: str) -> Iterator[tuple[int, Any]]:
    """(line or item number, event or _Refused) of each record of the stream."""
    if fmt == "ndjson":
        for number, line in enumerate(stream, 1):
            if line.strip():
                yield number, parsed_line(line)
    elif fmt == "json":
        try:
            items, _ = parse_events(stream.read())
        except BodyError as exc:
            yield 1, _Refused(exc.reason, f"the file is not a JSON array: {exc.message}", "")
            return
        yield from enumerate(items, 1)
    else:
        text = io.TextIOWrapper(stream, "utf-8", errors="replace", newline="")
        yield from _csv_records(text)
        text.detach()  # the file stays open: its position is the import's progress


def _csv_records(text: IO[str]) -> Iterator[tuple[int, Any]]:
    """CSV as RFC 4180 reads it, strictly: the first row names the columns (dotted
    names nest), an empty cell is absent; a row with more or fewer values than columns,
    or a quote left open, is refused with its line number rather than read otherwise
    (the standard reader took an unterminated quote as one value to the end of the
    file, and dropped extra values silently)."""
    reader = csv.reader(text, strict=True)
    header: list[str] | None = None
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield start, _Refused("bad_csv", f"is not CSV (RFC 4180): {exc}", "")
            continue
        if not row:
            continue  # a blank line
        if header is None:
            header = row
            continue
        if len(row) != len(header):
            yield start, _Refused(
                "bad_csv", f"has {len(row)} values for the {len(header)} columns of the "
                "header line", ",".join(row)[:4096],
            )  # fmt: skip
            continue
        yield start, _nested({k: v for k, v in zip(header, row, strict=True) if k and v})


MIN_BULK_BYTES_PER_SECOND = 16_384
"""The slowest a bulk body may arrive on average, past ``body_timeout_seconds`` of grace:
a client sending one byte a second (which resets any per-read timeout) is cut off with
408, whatever the size it announced."""

INFLATE_STEP = 1 << 20
"""Bytes inflated (and split) at a time, in a worker thread: a gzip bomb never holds more
than this unzipped, and the event loop never waits for it."""


@dataclass(frozen=True)
class Oversized:
    """A line longer than the largest event: counted, never buffered whole."""

    size: int


_NON_BLANK = re.compile(rb"[^ \t\r\n]")


class LineSplitter:
    """NDJSON lines out of a stream of bytes, in bounded memory.

    A line longer than ``max_line`` is skipped as it streams (only its size is kept)
    and comes out as :class:`Oversized`; runs of blank lines are counted by C code
    (``re.search``, ``bytes.count``), never one by one: 200 MB of newlines cost a few
    scans, not 200 million Python steps."""

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self.number = 0
        """Lines ended so far (the number of the last one)."""
        self._partial = bytearray()
        self._oversize = 0
        """The size of the line being skipped; 0 when none is."""

    def feed(self, data: bytes) -> list[tuple[int, bytes | Oversized]]:
        """The lines ``data`` completes, numbered, blank ones left out."""
        out: list[tuple[int, bytes | Oversized]] = []
        view = memoryview(data)
        position, end = 0, len(data)
        if self._partial or self._oversize:  # finish the line the last feed began
            newline = data.find(b"\n")
            if newline < 0:
                self._absorb(view)
                return out
            self._absorb(view[:newline])
            self._end_line(out)
            position = newline + 1
        while position < end:
            found = _NON_BLANK.search(data, position)
            if found is None:  # only blank lines left (and maybe the start of one)
                self.number += data.count(b"\n", position, end)
                break
            start = found.start()
            self.number += data.count(b"\n", position, start)
            line_start = data.rfind(b"\n", position, start) + 1 or position
            newline = data.find(b"\n", start)
            if newline < 0:
                self._absorb(view[line_start:])
                break
            self.number += 1
            if newline - line_start > self.max_line:
                out.append((self.number, Oversized(newline - line_start)))
            else:
                out.append((self.number, data[line_start:newline]))
            position = newline + 1
        return out

    def finish(self) -> list[tuple[int, bytes | Oversized]]:
        """The last line, if the stream did not end with a newline."""
        out: list[tuple[int, bytes | Oversized]] = []
        if self._oversize or bytes(self._partial).strip():
            self._end_line(out)
        return out

    def _absorb(self, piece: memoryview) -> None:
        if self._oversize:
            self._oversize += len(piece)
        elif len(self._partial) + len(piece) > self.max_line:
            self._oversize = len(self._partial) + len(piece)
            self._partial.clear()
        else:
            self._partial += piece

    def _end_line(self, out: list[tuple[int, bytes | Oversized]]) -> None:
        self.number += 1
        if self._oversize:
            out.append((self.number, Oversized(self._oversize)))
        elif bytes(self._partial).strip():
            out.append((self.number, bytes(self._partial)))
        self._partial.clear()
        self._oversize = 0


async def ndjson_lines(
    chunks: AsyncIterator[bytes], *, gzip: bool, limit: int, idle_seconds: float,
    max_line: int,
) -> AsyncIterator[tuple[int, bytes | Oversized]]:  # fmt: skip
    """The numbered non-empty lines of a streamed NDJSON body (gzip decoded), as they
    arrive; a line over ``max_line`` bytes as :class:`Oversized`. BodyError 413 once past
    ``limit`` bytes (unzipped), 408 when nothing comes for ``idle_seconds`` or the body
    arrives slower than :data:`MIN_BULK_BYTES_PER_SECOND` on average, 400 for gzip that
    is not. Inflating and splitting run in a worker thread, :data:`INFLATE_STEP` bytes at
    a time: memory stays bounded whatever the body inflates to."""
    inflater = zlib.decompressobj(wbits=31) if gzip else None
    splitter = LineSplitter(max_line)
    total = received = 0
    started = time.monotonic()
    iterator = chunks.__aiter__()
    while True:
        allowed = started + idle_seconds + received / MIN_BULK_BYTES_PER_SECOND - time.monotonic()
        try:
            if allowed <= 0:
                raise TimeoutError
            with Deadline(min(idle_seconds, allowed)):
                data = await iterator.__anext__()
        except StopAsyncIteration:
            break
        except ClientDisconnect:
            raise gone(f"after line {splitter.number}: the lines before it are kept") from None
        except TimeoutError:
            raise BodyError(408, "body_timeout", f"nothing received for {idle_seconds:g} s, or "
                            f"less than {MIN_BULK_BYTES_PER_SECOND} bytes/s on average, after "
                            f"line {splitter.number}") from None  # fmt: skip
        received += len(data)
        while data:
            data, inflated, over, lines = await asyncio.to_thread(
                _inflate_and_split, inflater, splitter, data, limit - total
            )
            total += inflated
            for line in lines:
                yield line
            if over:
                where = f"in line {splitter.number + 1}: the lines before it are kept"
                raise BodyError(413, "body_too_large",
                                f"body is over max_bulk_bytes ({limit} bytes) {where}")  # fmt: skip
    for line in splitter.finish():
        yield line


def _inflate_and_split(
    inflater: Any, splitter: LineSplitter, data: bytes, room: int
) -> tuple[bytes, int, bool, list[tuple[int, bytes | Oversized]]]:
    """One step of :func:`ndjson_lines`, in a worker thread: at most :data:`INFLATE_STEP`
    bytes inflated from ``data`` and split, never past ``room`` (one byte more says the
    body is over its limit). What of ``data`` is left for the next step, the bytes
    inflated, whether the body is over the limit, the lines completed."""
    step = min(INFLATE_STEP, room + 1)
    if inflater is None:
        out, rest = data[:step], data[step:]
    else:
        try:
            out = inflater.decompress(data, step)
        except zlib.error as exc:
            raise BodyError(400, "bad_encoding", f"body is not valid gzip: {exc}") from None
        rest = inflater.unconsumed_tail
    over = len(out) > room
    if over:
        out = out[:room]
    return rest, len(out), over, splitter.feed(out) if out else []


def with_id(key_id: str, item: Any, seen: Counter[bytes]) -> Any:
    """``item`` with an id derived from its content if it has none of its own."""
    if isinstance(item, dict) and not _has_id(item):
        context = item.setdefault("eventn_ctx", {})
        if isinstance(context, dict):
            context["event_id"] = content_id(key_id, item, seen)
    return item


def prepare_chunk(
    key_id: str, chunk: list[tuple[int, Any]], settings: EnrichSettings, ctx: RequestContext
) -> EnrichedBatch:
    """A chunk of numbered records (events, or _Refused) enriched: lines to append, and
    a record in failed/ for each rejected one, by its line number."""
    numbers = [number for number, _ in chunk]
    items = [item.raw if isinstance(item, _Refused) else item for _, item in chunk]
    refused = {i: (item.reason, item.message) for i, (_, item) in enumerate(chunk)
               if isinstance(item, _Refused)}  # fmt: skip
    out = EnrichedBatch(record_limit=len(chunk), label="line", numbers=numbers)
    return enrich_batch(items, ctx, settings, in_array=False, refused=refused, out=out)


def parsed_line(line: bytes | Oversized) -> Any:
    """One NDJSON line: its object, or a _Refused saying why not."""
    if isinstance(line, Oversized):
        return _Refused("event_too_large", f"is a line of {line.size} bytes, longer than "
                        "max_event_bytes: it was not read", "")  # fmt: skip
    try:
        items, in_array = parse_events(line)
    except BodyError as exc:
        message = exc.message.replace("body is ", "", 1)
        return _Refused(exc.reason, message, line.decode("utf-8", errors="replace")[:4096])
    if in_array:
        return _Refused("not_an_object", "is a JSON array, not an object", "")
    return items[0]


def _nested(row: dict[str, Any]) -> dict[str, Any]:
    """A CSV row with dotted headers (``user.id``) made into nested fields."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                break
            node = child
        else:
            node[leaf] = value
    return out


def content_id(key_id: str, item: dict[str, Any], seen: Counter[bytes]) -> str:
    """The id of an event without one: derived from the key, its content and how many
    identical events came before it in the file (the module's docstring)."""
    canonical = orjson.dumps(item, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS,
                             default=str)  # fmt: skip
    digest = hashlib.sha256(canonical).digest()
    occurrence = seen[digest]
    seen[digest] += 1
    return str(uuid.uuid5(IDS, f"{key_id}\0{occurrence}\0{digest.hex()}"))


def _has_id(item: dict[str, Any]) -> bool:
    context = item.get("eventn_ctx")
    own = context.get("event_id") if isinstance(context, dict) else None
    ids = (own, item.get("eventn_ctx_event_id"), item.get("event_id"), item.get("messageId"))
    return any(isinstance(v, str | int) and v != "" for v in ids)


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def imported_record(config: Config, digest: str) -> Path:
    return config.layout.root / "imports" / f"sha256={digest}.json"


def import_files(
    config: Config,
    paths: list[Path],
    key_id: str,
    *,
    fmt: str | None = None,
    force: bool = False,
    progress: Callable[[int], None] = lambda size: None,
) -> list[FileReport]:
    """Import ``paths`` as events of key ``key_id`` (the module's docstring); a report
    per file. ``progress(n)``: ``n`` more bytes of the files read."""
    if key_id not in {key.id for key in config.api_keys}:
        known = ", ".join(sorted(k.id for k in config.api_keys)) or "none"
        raise ConfigError(
            f"no api key {key_id!r} (configured: {known})",
            fix="import with the id of a key under api_keys: (see `eventpipe init`)",
        )
    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: one of {', '.join(FORMATS)}")
    return asyncio.run(_import(config, files_of(paths), key_id, fmt, force, progress))


async def _import(
    config: Config, files: list[Path], key_id: str, fmt: str | None, force: bool,
    progress: Callable[[int], None],
) -> list[FileReport]:  # fmt: skip
    log = SegmentLog(config.layout, LogSettings.of(config), writer=f"{host_id()}-import")
    log.open()
    await log.start()
    # Checked against the tracking plans here, where each event is parsed anyway (1.5 us
    # an event that meets its plan, about 10 one that breaks it), and marked as the
    # collector marks under ``flag``: the job takes the verdicts instead of parsing every
    # line again to check it (docs/contracts.md).
    settings = EnrichSettings(max_event_bytes=config.server.max_event_bytes,
                              anonymize_ip=config.server.anonymize_ip,
                              max_json_depth=config.server.max_json_depth,
                              contracts=tracking_plans(config))  # fmt: skip
    reports = []
    try:
        for path in files:
            reports.append(await _import_file(log, config, path, key_id, fmt, force,
                                              settings, progress))  # fmt: skip
    finally:
        await log.close()
    return reports


async def _import_file(
    log: SegmentLog, config: Config, path: Path, key_id: str, fmt: str | None, force: bool,
    settings: EnrichSettings, progress: Callable[[int], None],
) -> FileReport:  # fmt: skip
    report = FileReport(path)
    digest = file_digest(path)
    record = imported_record(config, digest)
    if record.exists() and not force:
        done = orjson.loads(record.read_bytes())
        report.skipped = f"already imported at {done['finished_at']} ({done['events']} events)"
        progress(path.stat().st_size)
        return report
    seen: Counter[bytes] = Counter()
    scrub = Scrubber.of_keys(config.api_keys)
    with path.open("rb", buffering=0) as raw, decompressed(raw, path.name) as stream:
        kind = fmt or format_of(path, stream)
        chunk: list[tuple[int, Any]] = []
        position = 0
        for number, item in records(stream, kind):
            chunk.append((number, with_id(key_id, item, seen)))
            if len(chunk) >= CHUNK:
                await _append(log, key_id, chunk, settings, report, scrub=scrub)
                chunk = []
                position = _advance(raw, position, progress)
        await _append(log, key_id, chunk, settings, report, scrub=scrub)
        _advance(raw, position, progress)
    write_file(record, orjson.dumps({
        "path": str(path.resolve()), "key": key_id, "format": kind, "events": report.events,
        "rejected": sum(report.rejected.values()), "finished_at": format_timestamp(utc_now()),
    }))  # fmt: skip
    return report


def _advance(raw: IO[bytes], position: int, progress: Callable[[int], None]) -> int:
    """Report the file's bytes read since ``position``."""
    now = raw.tell()
    if now > position:
        progress(now - position)
    return now


async def _append(
    log: SegmentLog, key_id: str, chunk: list[tuple[int, Any]], settings: EnrichSettings,
    report: FileReport, *, scrub: Scrubber,
) -> None:  # fmt: skip
    if not chunk:
        return
    now = utc_now()
    ctx = RequestContext(key_id=key_id, browser=False, source_ip="", user_agent=None,
                         received_at=now, timestamp=format_timestamp(now))  # fmt: skip
    batch = prepare_chunk(key_id, chunk, settings, ctx)
    await log.append(key_id, scrub(b"".join(batch.lines)), scrub(b"".join(batch.failed_lines)))
    report.events += len(batch.lines)
    report.rejected.update(batch.rejected)
    report.broken += batch.broken
