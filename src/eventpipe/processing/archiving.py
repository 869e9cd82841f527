"""Archiving a run's segments: ahead of the loads where it can, and the LZ4 files of
stream micro-batches and replays."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from eventpipe.archive.files import SUFFIX
from eventpipe.archive.write import archive_segment, prepare_segment
from eventpipe.config import Config
from eventpipe.errors import first_line
from eventpipe.files import replacing
from eventpipe.paths import DataLayout
from eventpipe.processing.run import step, stream_ids

if TYPE_CHECKING:
    pass

log = logging.getLogger("eventpipe.processing")


class ArchiveAhead:
    """Compresses a batch's segments for the archive on a driver thread while the run's
    tables load; archive_segment then moves the files into place (archive/write.py).

    The thread begins with the first load of a run (:meth:`begin`), not before: Spark's
    passes keep both cores of a small machine busy (compressing then only slowed them
    down), while loading into DuckDB leaves about 40% of them idle, and archiving alone
    (regex scans that hold the GIL) uses about 60%. On the batch benchmark the two then
    share the cores instead of running one after the other.

    A segment the thread could not prepare (an error, or not reached) is compressed when
    it is archived, as without it. What is not an error (a BaseException: an interrupt,
    an exit) ends the thread and is raised again by :meth:`finish`, in the run's thread.
    """

    def __init__(self, config: Config, names: Sequence[str]) -> None:
        self._config = config
        self._names = list(names)
        self._cancelled = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopped_by: BaseException | None = None

    def begin(self) -> None:
        with self._lock:
            if self._thread is None and self._names and not self._cancelled.is_set():
                self._thread = threading.Thread(target=self._prepare, name="archive-ahead",
                                                daemon=True)  # fmt: skip
                self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def finish(self, *, cancel: bool = False) -> None:
        """Wait for the thread; ``cancel``: stop it after the segment it is on (and never
        start it)."""
        with self._lock:
            if cancel:
                self._cancelled.set()
            thread = self._thread
        if thread is not None:
            thread.join()
        stopped_by, self._stopped_by = self._stopped_by, None
        if stopped_by is not None:
            raise stopped_by

    def _prepare(self) -> None:
        layout = self._config.layout
        for name in self._names:
            if self._cancelled.is_set():
                return
            try:
                prepare_segment(layout, name, self._config.archive)
            except Exception as exc:  # noqa: BLE001 (archiving compresses it itself)
                log.warning("archiving %s ahead: %s; it is compressed when archived", name,
                            first_line(exc))  # fmt: skip
            except BaseException as exc:  # noqa: BLE001 (not an error: finish raises it)
                self._stopped_by = exc
                return


def archive_segments(config: Config, names: Sequence[str]) -> list[Path]:
    """Archive the segments of ``names`` that every stream destination has read."""
    from eventpipe.log.tail import consumed

    layout = config.layout
    streams = stream_ids(config)
    ready = [n for n in names if consumed(layout, streams, layout.incoming / n)]
    if not ready:
        return []
    # LZ4 and the checksums release the GIL, the id scan does not: two threads archive
    # 1.2x faster than one (bench/archive.py).
    pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1)
    with step(f"archive {len(ready)} segment(s)"), pool:
        archived = list(pool.map(lambda n: archive_segment(layout, n, config.archive), ready))
    _drop_stale_ahead(layout)
    return archived


def _drop_stale_ahead(layout: DataLayout) -> None:
    """Remove files archived ahead for segments that are no longer in incoming/."""
    ahead = layout.tmp / "archive-ahead"
    if not ahead.is_dir():
        return
    present = {p.name for p in layout.sealed_segments()}
    for path in ahead.iterdir():
        if path.name.split(SUFFIX)[0] not in present:
            path.unlink(missing_ok=True)


def compress(sources: Sequence[Path], target: Path) -> None:
    """``sources`` one after the other into ``target`` as LZ4 frames, the archive's one
    format (``lz4 -d`` reads it; each frame carries its content checksum), atomically and
    fsynced; then removed."""
    import lz4.frame

    if not any(source.exists() for source in sources):
        return  # done by an earlier attempt
    with replacing(target) as file:
        for source in sources:
            with source.open("rb") as src:
                while block := src.read(FRAME_BYTES):
                    file.write(lz4.frame.compress(block, content_checksum=True, store_size=True))
    for source in sources:
        source.unlink()


FRAME_BYTES = 8 << 20
"""Bytes of a side file per LZ4 frame (as the segments' frames, bounded in memory)."""
