"""Small runs in a warm session: the pipeline's batch run over a handful of events, again
and again in one Spark session, as ``eventpipe process`` runs its period and a stream
its micro-batches. What such a run costs is not the events but the work per run: Spark
analysing, optimising and compiling the plans of each destination, and the calls from
Python into the JVM that build them.

Two kinds of session side by side, alternating, each in a process of its own (PySpark
reads one of the settings once per process):

- "Spark's defaults": ``spark.python.sql.dataFrameDebugging.enabled`` and
  ``spark.sql.constraintPropagation.enabled`` as Spark ships them (true);
- "eventpipe's defaults": both false (eventpipe.processing.runtime.spark.DEFAULTS).

    .venv/bin/python bench/small_runs.py --rounds 8 --repeats 2

Each run: ``--events`` events of varied keys (new columns arrive, as they do) in one
sealed segment, into DuckDB, Parquet, Iceberg and Delta tables named by event type.
Prints per kind the median run (the first of each process, cold, left out), the JVM's
and Python's CPU, the calls from Python into the JVM, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
SPARK_DEFAULTS = {
    "spark.python.sql.dataFrameDebugging.enabled": "true",
    "spark.sql.constraintPropagation.enabled": "true",
}
KINDS = {"Spark's defaults": SPARK_DEFAULTS, "eventpipe's defaults": {}}


def child(rounds: int, events: int, overrides: dict[str, str]) -> dict[str, Any]:
    """Runs ``rounds`` batch runs in one session; their figures."""
    sys.path.insert(0, str(ROOT / "src"))
    from py4j import clientserver

    from eventpipe.config import parse_config
    from eventpipe.processing.batch.job import process_once
    from eventpipe.processing.runtime.spark import start_session

    calls = [0]
    send = clientserver.ClientServerConnection.send_command

    def counted(self: Any, command: str, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return send(self, command, *args, **kwargs)

    clientserver.ClientServerConnection.send_command = counted
    data = Path(tempfile.mkdtemp(prefix="eventpipe-small-")) / "data"
    named = {"table_name_template": "{{ event_type }}"}
    config = parse_config({
        "data_dir": str(data),
        "api_keys": [{"id": "web", "server": "s2s-web-secret-1"}],
        "destinations": {kind: {"type": kind, **named}
                         for kind in ("duckdb", "parquet", "iceberg", "delta")},
    }, source="bench", env={})  # fmt: skip
    spark = start_session({"spark.master": "local[2]", **overrides})
    rng = random.Random(1)
    incoming = data / "incoming"
    incoming.mkdir(parents=True)
    seconds, calls_per_run = [], []
    for run in range(rounds):
        lines = [orjson.dumps({
            "eventn_ctx": {"event_id": f"r{run}n{n}", "user_agent": "Mozilla/5.0 Firefox/133.0"},
            "_timestamp": "2026-11-21T10:00:00.000000Z", "api_key": "web",
            "event_type": rng.choice(["page", "click", "order"]), "source_ip": "192.0.2.1",
            f"k{rng.randint(0, 50)}": rng.choice([1, "x", 2.5, True, [1, 2], {"z": 1}]),
            "props": {f"p{rng.randint(0, 30)}": n},
        }) for n in range(events)]  # fmt: skip
        name = f"incoming.tok=web|w=a-0-2026-11-23T10-00-{run:02d}.000.log"
        (incoming / name).write_bytes(b"\n".join(lines) + b"\n")
        before, started = calls[0], time.perf_counter()
        report = process_once(config, spark)
        seconds.append(time.perf_counter() - started)
        calls_per_run.append(calls[0] - before)
        # A value that does not fit its column's type goes to failed/, as it would.
        if (
            report is None
            or sum(report.loaded.values()) + sum(report.failed.values()) != 4 * events
        ):
            raise SystemExit(f"run {run}: events neither loaded nor failed: {report}")
    jvm = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
    with open(f"/proc/{jvm}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return {
        "seconds": seconds[1:],
        "calls": statistics.median(calls_per_run[1:]),
        "jvm_cpu": (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"),
        "python_cpu": sum(os.times()[:2]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=8, help="runs in each session")
    parser.add_argument("--repeats", type=int, default=2, help="sessions of each kind")
    parser.add_argument("--events", type=int, default=7, help="events in each run")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.rounds, args.events, KINDS[args.child])))
        return
    found: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    for repeat in range(args.repeats):
        for kind in KINDS:
            done = subprocess.run(
                [sys.executable, __file__, "--child", kind, "--rounds", str(args.rounds),
                 "--events", str(args.events)],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise SystemExit(f"{kind} failed:\n{done.stderr[-4000:]}")
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            found[kind].append(figures)
            median = statistics.median(figures["seconds"])
            cpu = f"JVM {figures['jvm_cpu']:.1f} s and Python {figures['python_cpu']:.1f} s"
            print(f"  session {repeat + 1}, {kind}: median run {median:.2f} s, {cpu} of CPU, "
                  f"{figures['calls']:.0f} calls into the JVM a run", flush=True)  # fmt: skip
    print(f"\n{args.events} events into 4 destinations, runs 2-{args.rounds} of each session:")
    medians = {}
    for kind, sessions in found.items():
        medians[kind] = statistics.median(s for f in sessions for s in f["seconds"])
        jvm = statistics.median(f["jvm_cpu"] for f in sessions)
        python = statistics.median(f["python_cpu"] for f in sessions)
        print(f"  {kind}: median run {medians[kind]:.2f} s; a session's CPU: JVM {jvm:.1f} s, "
              f"Python {python:.1f} s")  # fmt: skip
    ratio = medians["eventpipe's defaults"] / medians["Spark's defaults"]
    print(f"  eventpipe's defaults / Spark's defaults: {ratio:.2f}x")


if __name__ == "__main__":
    main()
