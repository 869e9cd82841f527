"""Cold-start benchmark: ``eventpipe process --once`` of a small batch, end to end, as cron
or an Airflow task runs it (a new process, a new JVM), with and without the JVM
class-data archive (``eventpipe spark-archive``), alternating, in one run.

    .venv/bin/python bench/cold_start.py --runs 3 --events 3

Each run: a fresh data directory holding one sealed segment of ``--events`` events, a
DuckDB destination, the command timed from its start to its exit. "Without" points
EVENTPIPE_CACHE_DIR at an empty directory, so no archive is found. Prints each run, the
medians and their ratio; also the idle tick (nothing to process, no Spark). A small
batch's JVM compiles with its quick compiler only (spark.java_options); "both compilers"
configures the JVM's default back (``-XX:TieredStopAtLevel=4``), to show what that
saves. "PySpark's Python daemon" configures ``spark.python.daemon.module:
pyspark.daemon``, whose workers import PySpark (from Spark's zip, compiling it), pyarrow,
pandas and eventpipe's task modules each (eventpipe's daemon imports them once:
processing/runtime/python_daemon.py). Besides the time, each run's CPU: the command's and
all its processes' (the JVM, the Python daemon and its workers).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import yaml

ROOT = Path(__file__).resolve().parents[1]
EVENTPIPE = str(Path(sys.executable).with_name("eventpipe"))
PR_SET_CHILD_SUBREAPER = 36


def one_run(
    work: Path, events: int, cache: Path | None, rows_of: int, spark: dict[str, str]
) -> tuple[float, float]:
    """Seconds and CPU seconds of one cold ``process --once`` over ``events`` events."""
    data = work / f"data-{rows_of}"
    incoming = data / "incoming"
    incoming.mkdir(parents=True)
    lines = [
        orjson.dumps({"event_type": "page_view", "api_key": "web",
                      "_timestamp": f"2026-11-24T10:00:{n % 60:02d}Z",
                      "eventn_ctx": {"event_id": f"e{n}"},
                      "page": {"url": f"https://example.com/{n}"}, "n": n}) + b"\n"
        for n in range(events)
    ]  # fmt: skip
    (incoming / "incoming.tok=web-2026-11-24T10-00-00.000.log").write_bytes(b"".join(lines))
    config = work / f"eventpipe-{rows_of}.yaml"
    settings = {
        "data_dir": str(data),
        "destinations": {"warehouse": {"type": "duckdb",
                                       "path": str(work / f"w-{rows_of}.duckdb")}},
    }  # fmt: skip
    if spark:
        settings["spark"] = spark
    config.write_text(yaml.safe_dump(settings))
    env = dict(os.environ)
    if cache is not None:
        env["EVENTPIPE_CACHE_DIR"] = str(cache)
    cpu = _children_cpu()
    started = time.perf_counter()
    done = subprocess.run([EVENTPIPE, "-c", str(config), "process", "--once"], env=env,
                          capture_output=True, text=True)  # fmt: skip
    seconds = time.perf_counter() - started
    _reap_orphans()
    cpu = _children_cpu() - cpu
    if done.returncode != 0 or f"warehouse.events: {events} rows" not in done.stdout:
        output = f"{done.stdout}\n{done.stderr}"
        raise SystemExit(f"process --once failed ({done.returncode}):\n{output}")
    return seconds, cpu


def _become_subreaper() -> None:
    """The command's JVM outlives it by a moment (it stops when its driver's pipe closes)
    and its Python daemon is the JVM's: as their subreaper, this process waits for them,
    and their CPU counts in its children's."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _reap_orphans() -> None:
    """Waits for every process left to this subreaper."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _children_cpu() -> float:
    """CPU seconds of the waited-for processes so far (each with those it waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="runs of each kind")
    parser.add_argument("--events", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from eventpipe.processing.runtime import class_data

    _become_subreaper()
    archive = class_data.archive_path()
    if archive is None or not archive.is_file():
        raise SystemExit(f"no class-data archive at {archive}: run `eventpipe spark-archive`")
    print(f"archive: {archive} ({archive.stat().st_size / 2**20:.0f} MB)")
    # Kinds: (EVENTPIPE_CACHE_DIR or None for the real one, configured Spark settings).
    kinds: dict[str, tuple[str | None, dict[str, str]]] = {
        "without the archive": ("empty", {}),
        "with the archive, both compilers": (
            None, {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=4"}),
        "with the archive, PySpark's Python daemon": (
            None, {"spark.python.daemon.module": "pyspark.daemon"}),
        "with the archive (the default)": (None, {}),
    }  # fmt: skip
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    cpus: dict[str, list[float]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="eventpipe-cold-") as tmp:
        work, empty = Path(tmp), Path(tmp) / "no-cache"
        empty.mkdir()
        count = 0
        for n in range(args.runs):
            for kind, (cache, spark) in kinds.items():
                count += 1
                seconds, cpu = one_run(work, args.events, empty if cache else None, count, spark)
                times[kind].append(seconds)
                cpus[kind].append(cpu)
                print(f"  run {n + 1}, {kind}: {seconds:.2f} s, {cpu:.1f} s of CPU", flush=True)
        idle = work / "idle.yaml"
        idle.write_text(yaml.safe_dump({"data_dir": str(work / "idle"),
                                        "destinations": {"w": {"type": "duckdb"}}}))  # fmt: skip
        started = time.perf_counter()
        subprocess.run([EVENTPIPE, "-c", str(idle), "process", "--once"], check=True,
                       capture_output=True)  # fmt: skip
        idle_seconds = time.perf_counter() - started
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    print(f"\ncold process --once of {args.events} event(s), median of {args.runs}:")
    for kind, value in medians.items():
        print(f"  {kind}: {value:.2f} s, {statistics.median(cpus[kind]):.1f} s of CPU")
    default = medians["with the archive (the default)"]
    print(f"  without the archive / the default: {medians['without the archive'] / default:.2f}x")
    pyspark_daemon = statistics.median(cpus["with the archive, PySpark's Python daemon"])
    own_daemon = statistics.median(cpus["with the archive (the default)"])
    print(f"  CPU, the default / PySpark's Python daemon: {own_daemon / pyspark_daemon:.2f}x")
    print(f"idle tick (nothing sealed, no Spark): {idle_seconds:.2f} s")


if __name__ == "__main__":
    main()
