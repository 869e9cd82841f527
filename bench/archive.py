"""Archive benchmark: eventpipe's raw archive next to `gzip -6` and `lz4 -1`, in one run.

    .venv/bin/python bench/archive.py --events 1000000

On the batch benchmark's events (bench/batch.py, ~330 bytes each, in segments of
250,000), times:

* eventpipe: archiving every segment (LZ4 frames, index, id hashes, manifest, fsync),
  one segment at a time and as the pipeline does it (one thread per core);
* `gzip -6` and `lz4 -1`, the standard tools, on the same files, one at a time;
* `eventpipe archive verify` over the day;
* reading one event by id (`archive cat --event-id`), for 200 random ids, next to the
  tools' way: the day's files through `lz4 -dc` into `grep -F`;
* reading the whole day back (`archive cat --day`).

Prints sizes (ratio to the raw bytes), MB/s of raw bytes, and the read times.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))


def _tool(command: list[str], sources: list[Path], suffix: str) -> tuple[float, int]:
    """Seconds and output bytes of ``command`` run on each source in turn."""
    started = time.perf_counter()
    size = 0
    for source in sources:
        target = source.with_name(source.name + suffix)
        with target.open("wb") as out:
            subprocess.run([*command, str(source)], stdout=out, check=True)
        size += target.stat().st_size
        target.unlink()
    return time.perf_counter() - started, size


def main() -> None:
    from batch import generate
    from eventpipe.archive import read
    from eventpipe.archive.files import segments_of_day
    from eventpipe.archive.verify import verify
    from eventpipe.archive.write import archive_segment
    from eventpipe.config import ArchiveConfig
    from eventpipe.paths import DataLayout

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--level", type=int, default=0, help="archive.compression_level")
    parser.add_argument("--frame-events", type=int, default=1000)
    args = parser.parse_args()
    settings = ArchiveConfig(compression_level=args.level, frame_events=args.frame_events)

    work = Path(tempfile.mkdtemp(prefix="eventpipe-archive-bench-"))
    try:
        source = work / "source"
        raw_bytes = generate(source, args.events)
        sources = sorted(source.iterdir())
        mb = raw_bytes / 1e6
        print(f"{args.events:,} events, {mb:.1f} MB in {len(sources)} segments")
        rows: list[tuple[str, float, int]] = []

        def archive(workers: int) -> tuple[float, DataLayout]:
            layout = DataLayout(work / f"data-{workers}")
            shutil.copytree(source, layout.incoming)
            subprocess.run(["sync"], check=True)
            started = time.perf_counter()
            with ThreadPoolExecutor(max_workers=workers) as pool:
                list(pool.map(lambda p: archive_segment(layout, p.name, settings), sources))
            return time.perf_counter() - started, layout

        serial, _ = archive(1)
        parallel, layout = archive(2)
        [day] = [d for d in layout.archive.iterdir() if d.is_dir()]
        data_bytes = sum(f.stat().st_size for f in day.glob("*.lz4"))
        all_bytes = sum(f.stat().st_size for f in day.iterdir())
        rows.append(("eventpipe archive, 1 thread", serial, data_bytes))
        rows.append(("eventpipe archive, 2 threads", parallel, data_bytes))
        gzip_s, gzip_bytes = _tool(["gzip", "-6", "-c"], sources, ".gz")
        rows.append(("gzip -6", gzip_s, gzip_bytes))
        lz4_s, lz4_bytes = _tool(["lz4", "-1", "-c"], sources, ".lz4")
        rows.append(("lz4 -1", lz4_s, lz4_bytes))
        print(f"\n{'':30} {'seconds':>8} {'MB/s':>7} {'size MB':>8} {'ratio':>6}")
        for label, seconds, size in rows:
            print(f"{label:30} {seconds:8.2f} {mb / seconds:7.0f} {size / 1e6:8.1f} "
                  f"{size / raw_bytes:6.1%}")  # fmt: skip
        print(f"eventpipe with its index, ids and manifests: {all_bytes / 1e6:.1f} MB "
              f"({all_bytes / raw_bytes:.1%}); the sidecars are "
              f"{(all_bytes - data_bytes) / data_bytes:.1%} of the .lz4 files")  # fmt: skip

        started = time.perf_counter()
        report = verify(layout)
        verify_s = time.perf_counter() - started
        assert report.ok, report.problems
        print(f"\narchive verify: {verify_s:.2f} s, {mb / verify_s:.0f} MB/s of raw bytes, "
              f"{report.frames:,} frames")  # fmt: skip

        rng = random.Random(7)
        wanted = [f"e{rng.randrange(args.events)}" for _ in range(200)]
        times = []
        for event in wanted:
            started = time.perf_counter()
            found = list(read.find(day, event))
            times.append(time.perf_counter() - started)
            assert len(found) == 1, event
        times.sort()
        print(f"one event by id (200 ids): median {statistics.median(times) * 1e3:.2f} ms, "
              f"p99 {times[197] * 1e3:.2f} ms")  # fmt: skip
        started = time.perf_counter()
        files = " ".join(str(p) for p in sorted(day.glob("*.lz4")))
        needle = f'"event_id":"{wanted[0]}"'
        grep = subprocess.run(f"cat {files} | lz4 -dc | grep -F '{needle}'", shell=True,
                              capture_output=True, check=True)  # fmt: skip
        grep_s = time.perf_counter() - started
        assert grep.stdout.count(b"\n") == 1
        print(f"the same with cat | lz4 -dc | grep -F: {grep_s * 1e3:.0f} ms "
              f"({grep_s / statistics.median(times):.0f}x)")  # fmt: skip

        started = time.perf_counter()
        events = 0
        for segment in segments_of_day(day):
            events += sum(1 for _ in read.lines(segment))
        cat_s = time.perf_counter() - started
        assert events == args.events
        print(f"whole day read back: {cat_s:.2f} s, {events / cat_s:,.0f} events/s, "
              f"{mb / cat_s:.0f} MB/s")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
