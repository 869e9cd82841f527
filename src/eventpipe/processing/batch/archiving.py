"""Archiving a run's segments: ahead of the loads where it can, and the LZ4 files of
stream micro-batches and replays."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from eventpipe.archive.files import SUFFIX
from eventpipe.archive.remote import pending, remote_of
from eventpipe.archive.write import ahead_of, archive_segment, prepare_segment
from eventpipe.config import Config
from eventpipe.errors import first_line
from eventpipe.files import replacing
from eventpipe.paths import DataLayout
from eventpipe.processing.batch import segment_schemas
from eventpipe.processing.batch.run import batch_destinations, step, stream_ids
from eventpipe.processing.runtime import shutdown
from eventpipe.processing.runtime.pipeline import PipelineBusyError, pipeline_lock

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("eventpipe.processing")


class ArchiveAhead:
    """Compresses a batch's segments for the archive on a driver thread while the run's
    tables load; archive_segment then moves the files into place (archive/write.py).

    The thread begins with the first load of a run (:meth:`begin`), not before: Spark's
    passes keep both cores of a small machine busy (compressing then only slowed them
    down), while loading into DuckDB leaves about 40% of them idle, and archiving alone
    (regex scans that hold the GIL) uses about 60%. On the batch benchmark the two then
    share the cores instead of running one after the other.

    Segments compressed already (by the wait of ``eventpipe process`` before the run,
    :func:`wait_preparing_sealed`) are skipped: with none left, no thread starts, and the
    loads take every thread they may (processing/batch/load.py).

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

    def begin(self) -> bool:
        """Start the thread if there is anything to compress (segments still in
        incoming/ without their files ahead); whether it runs."""
        with self._lock:
            if self._thread is None and not self._cancelled.is_set():
                layout = self._config.layout
                self._names = [n for n in self._names if (layout.incoming / n).exists()
                               and not ahead_of(layout, n).data.exists()]  # fmt: skip
                if self._names:
                    self._thread = threading.Thread(target=self._prepare, name="archive-ahead",
                                                    daemon=True)  # fmt: skip
                    self._thread.start()
            return self.running

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


def prepare_sealed(config: Config, spark: SparkSession | None = None) -> list[str]:
    """Compress ahead, as :class:`ArchiveAhead` does, the sealed segments that have no
    archive files ahead yet, and given ``spark``, keep the inferred schema of those that
    have none (segment_schemas.py); the names of those it prepared.

    Each segment under the pipeline lock, taken for that segment only: never beside a
    run (whose own archiving writes the same files), in this process or another. When a
    run holds the lock, or the process is stopping, it returns at once: the run
    archives what is left, and infers what has no schema kept."""
    layout = config.layout
    if not batch_destinations(config):
        spark = None  # stream destinations only: no batch run reads a schema
    settings = None if spark is None else segment_schemas.inference_settings(spark)
    prepared: list[str] = []
    for path in layout.sealed_segments():
        if shutdown.requested():
            break
        compress = not ahead_of(layout, path.name).data.exists()
        infer = settings is not None and not segment_schemas.is_kept(layout, path.name, settings)
        if not compress and not infer:
            continue
        try:
            with pipeline_lock(config):
                if compress:
                    prepare_segment(layout, path.name, config.archive)
                if infer and spark is not None and settings is not None:
                    segment_schemas.keep_schema(spark, layout, path.name, settings)
        except PipelineBusyError:
            break
        except Exception as exc:  # noqa: BLE001 (the run does it itself)
            log.warning("preparing %s ahead: %s; the run compresses and infers what is "
                        "left", path.name, first_line(exc))  # fmt: skip
            continue
        prepared.append(path.name)
    return prepared


def wait_preparing_sealed(
    config: Config, seconds: float, spark: SparkSession | None = None, *, poll: float = 1.0
) -> bool:
    """The wait between two batch runs of ``eventpipe process`` (``seconds``), spent
    preparing the segments sealed meanwhile (:func:`prepare_sealed`, looked for every
    ``poll`` seconds): compressed for the archive, and their schemas inferred with
    ``spark``. The next run then moves their archive files into place instead of
    compressing them beside its loads, and merges their schemas instead of inferring
    them. True at once if the process is stopping (as :func:`shutdown.wait`).

    Spark is idle in that wait, so neither costs the run anything: on the batch
    benchmark (1M events), the archive's 2.8-2.9 s of one core that the run otherwise
    spends beside and after its loads, and the inference's 4.2-4.5 s (docs/pipeline.md).
    """
    deadline = time.monotonic() + seconds
    while True:
        started = time.monotonic()
        if prepared := prepare_sealed(config, spark):
            log.info("prepared %d sealed segment(s) while waiting: %.1f s",
                     len(prepared), time.monotonic() - started)  # fmt: skip
        left = deadline - time.monotonic()
        if left <= 0:
            return shutdown.requested()
        if shutdown.wait(min(poll, left)):
            return True


def archive_segments(config: Config, names: Sequence[str]) -> list[Path]:
    """Archive the segments of ``names`` that every stream destination has read."""
    from eventpipe.log.tail import consumed

    layout = config.layout
    streams = stream_ids(config)
    ready = [n for n in names if consumed(layout, streams, layout.incoming / n)]
    archived: list[Path] = []
    if ready:
        # LZ4 and the checksums release the GIL, the id scan does not: two threads
        # archive 1.2x faster than one (bench/archive.py).
        pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1)
        with step(f"archive {len(ready)} segment(s)"), pool:
            archived = list(pool.map(lambda n: archive_segment(layout, n, config.archive),
                                     ready))  # fmt: skip
        _drop_stale_ahead(layout)
        segment_schemas.forget_gone(layout)
    upload_archived(config, archived)
    return archived


def upload_archived(config: Config, archived: Sequence[Path]) -> None:
    """Upload the days of ``archived`` to the archive's remote copy, with the days an
    earlier upload left pending (a store that fails delays the copy, never the run)."""
    remote = remote_of(config.archive)
    if remote is None:
        return
    days = {path.parent.name for path in archived}
    if not days and not pending(config.layout):
        return
    with step(f"upload the archive's day(s) to {config.archive.remote}"):
        synced = remote.sync(config.layout, days)
    log.info("archive: %d segment(s) uploaded to %s%s", synced.uploaded, config.archive.remote,
             f"; pending: {', '.join(synced.pending)}" if synced.pending else "")  # fmt: skip


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
