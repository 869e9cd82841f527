"""Tracking plans: ingest with 20 plans checked at the collector (``contracts.collector:
flag``) beside the same collector without them, in one run, alternating rounds; and with
``--batch-events N``, the batch job over N events with plans (every event flagged or not)
beside the same job without, alternating runs. The job's events go through a collector
first (over HTTP, 100 to a post): for the run with plans, one that checks them under the
same plans (``collector: flag``), whose verdicts the job takes; for the run without, one
without plans. With ``--in-job`` they are written straight to the log, and the job
checks every one; with ``--imported`` they are brought in by ``eventpipe import``, which
checks them as a collector under ``flag`` does.

    .venv/bin/python bench/contracts.py --seconds 8 --rounds 3
    .venv/bin/python bench/contracts.py --batch-events 1000000 --rounds 2 --no-ingest
    .venv/bin/python bench/contracts.py --batch-events 1000000 --rounds 2 --no-ingest --in-job
    .venv/bin/python bench/contracts.py --batch-events 1000000 --rounds 2 --no-ingest --imported

The events are bench/ingest.py's (four event types, ~450 bytes each); 20 plans: one for
each of the four types (types, required fields, a pattern, an enum, bounds: every event
meets its plan, so each is checked in full) and 16 for types that never come. wrk drives
each server with 16 connections, 100-event posts, then single-event posts. Prints
events/s and the ratio with plans / without (the goal: at least 0.8x). The batch job's
events are bench/batch.py's (five types; 20 plans, five of them for those types), into
DuckDB; the ratio is of the median `process --once` times (the goal: within 1.15x).
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest import free_port, make_event, print_alternating, run_wrk, start_eventpipe, wait_ready

PLAN = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["event_type", "user", "page", "properties"],
    "properties": {
        "user": {"type": "object", "required": ["anonymous_id"],
                 "properties": {"anonymous_id": {"type": "string", "pattern": "^a[0-9a-f]+$"},
                                "id": {"type": "integer", "minimum": 1}}},
        "page": {"type": "object", "required": ["url"],
                 "properties": {"url": {"type": "string", "format": "uri"},
                                "title": {"type": "string", "maxLength": 200}}},
        "properties": {"type": "object",
                       "properties": {"price": {"type": "number", "minimum": 0},
                                      "currency": {"enum": ["EUR", "USD", "GBP"]},
                                      "items": {"type": "integer", "minimum": 0}}},
        "screen": {"type": "object"},
    },
}  # fmt: skip
TYPES = ["page_view", "click", "signup", "purchase"]


def write_plans(directory: Path) -> None:
    directory.mkdir()
    others = [f"unused_{n}" for n in range(16)]
    for event_type in [*TYPES, *others]:
        plan = {**PLAN, "x-eventpipe": {"event_type": event_type}}
        (directory / f"{event_type}.json").write_text(json.dumps(plan))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument(
        "--batch-events", type=int, default=0, help="also time the batch job over this many events"
    )
    parser.add_argument("--no-ingest", action="store_true", help="the batch job only")
    parser.add_argument(
        "--all-meet", action="store_true",
        help="the batch job's plan takes discount as text too: no event breaks it (by "
        "default a third of the events do)",
    )  # fmt: skip
    parser.add_argument(
        "--in-job", action="store_true",
        help="the batch job's events written straight to its log, so that the job checks "
        "every one (by default they go through a collector, which checks them under the "
        "plans for the run with plans)",
    )  # fmt: skip
    parser.add_argument(
        "--imported", action="store_true",
        help="the batch job's events brought in by `eventpipe import` (which checks them "
        "under the plans for the run with plans), not posted to a collector",
    )  # fmt: skip
    args = parser.parse_args()
    if not args.no_ingest:
        ingest(args)
    if args.batch_events:
        way = "in-job" if args.in_job else "imported" if args.imported else "collected"
        batch(args.batch_events, args.rounds, all_meet=args.all_meet, way=way)


BATCH_PLAN = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["event_type", "user", "page", "properties", "_timestamp"],
    "properties": {
        "user": {"type": "object", "required": ["anonymous_id"],
                 "properties": {"anonymous_id": {"type": "string", "pattern": "^a[0-9a-f]+$"},
                                "id": {"type": "integer", "minimum": 1}}},
        "page": {"type": "object", "required": ["url"],
                 "properties": {"url": {"type": "string", "format": "uri"}}},
        "properties": {"type": "object",
                       "properties": {"price": {"type": "number", "minimum": 0},
                                      "quantity": {"type": "integer", "minimum": 1},
                                      "discount": {"type": "number"},
                                      "tags": {"type": "array", "items": {"type": "string"}}}},
        "_timestamp": {"type": "string", "format": "date-time"},
    },
}  # fmt: skip
"""A plan for bench/batch.py's events; ``discount`` comes as text a third of the time:
those events break it (flagged)."""


def batch(events: int, rounds: int, *, all_meet: bool = False, way: str = "collected") -> None:
    import logging
    import time

    logging.basicConfig(format="    %(name)s: %(message)s")
    logging.getLogger("eventpipe.processing").setLevel(logging.INFO)

    from batch import EVENT_TYPES, destination_config, generate
    from eventpipe.processing.batch.job import process_once
    from eventpipe.processing.runtime.spark import start_session

    with tempfile.TemporaryDirectory(prefix="eventpipe-contracts-batch-") as tmp:
        work = Path(tmp)
        plans = work / "plans"
        plans.mkdir()
        for event_type in [*EVENT_TYPES, *(f"unused_{n}" for n in range(20 - len(EVENT_TYPES)))]:
            plan = {**BATCH_PLAN, "x-eventpipe": {"event_type": event_type}}
            if all_meet:
                plan = json.loads(json.dumps(plan).replace(
                    '"discount": {"type": "number"}', '"discount": {"type": ["number", "string"]}'
                ))  # fmt: skip
            (plans / f"{event_type}.json").write_text(json.dumps(plan))
        generate(work / "source", events)
        with_plans = {"contracts": {"plans": [str(plans)]}}
        sources = {"without plans": "source", "with 20 plans": "source"}
        if way != "in-job":  # through the collector or an import, with and without the check
            bring = collect if way == "collected" else imported
            for name, (source, extra) in {
                "without plans": ("plain", None),
                "with 20 plans": ("checked", {"contracts": {**with_plans["contracts"],
                                                            "collector": "flag"}}),
            }.items():  # fmt: skip
                seconds = bring(work / "source", work / f"{way}-{source}", work / source, extra)
                print(f"  {way} {events:,} events {name} in {seconds:.1f} s", flush=True)
                sources[name] = source
        spark = start_session(
            destination_config(work, "settings", {"type": "duckdb"}).spark.settings
        )
        for name, sections in (("without plans", {}), ("with 20 plans", with_plans)):
            # Each way once first: the JVM, its compiled code, the Python workers, the plans.
            warm = destination_config(work, f"warm_{len(sections)}", {"type": "duckdb"},
                                      source=sources[name], **sections)  # fmt: skip
            process_once(warm, spark)
        times: dict[str, list[float]] = {"without plans": [], "with 20 plans": []}
        for n in range(rounds):
            for name, sections in (("without plans", {}), ("with 20 plans", with_plans)):
                label = f"r{n}_{'plans' if sections else 'plain'}"
                config = destination_config(work, label, {"type": "duckdb"},
                                            source=sources[name], **sections)  # fmt: skip
                started = time.perf_counter()
                process_once(config, spark)
                times[name].append(time.perf_counter() - started)
                print(f"  {name}: {times[name][-1]:.1f} s", flush=True)
        spark.stop()
    medians = {name: statistics.median(t) for name, t in times.items()}
    breaking = "no event breaks its plan" if all_meet else "a third of the events break it"
    how = {"collected": "collected: with plans checked at the collector, the job taking its "
                        "verdicts",
           "imported": "imported: with plans checked by the import, the job taking its verdicts",
           "in-job": "not collected: every event checked in the job"}[way]  # fmt: skip
    print(f"\nbatch job over {events:,} events into DuckDB, {rounds} alternating rounds "
          f"({breaking}; {how})")  # fmt: skip
    for name, seconds in medians.items():
        print(f"  {name}: {seconds:.1f} s median ({events / seconds:,.0f} events/s)")
    ratio = medians["with 20 plans"] / medians["without plans"]
    print(f"  with plans / without = {ratio:.2f}x the time")
    # Each round's pair ran back to back: its ratio is less moved by the machine's drift
    # over the run than the medians taken apart.
    pairs = [w / o for w, o in zip(times["with 20 plans"], times["without plans"], strict=True)]
    print(f"  round by round: {', '.join(f'{r:.2f}' for r in pairs)}x "
          f"(median {statistics.median(pairs):.2f}x)")  # fmt: skip


def collect(source: Path, work: Path, out: Path, extra: dict[str, object] | None) -> float:
    """The events of ``source``'s segments posted to a collector (``extra``: more of its
    config) over HTTP, 100 to a post; its sealed segments moved to ``out``. Returns the
    seconds the posts took."""
    import http.client
    import time

    from ingest import SERVER_KEY

    work.mkdir()
    port = free_port()
    [proc] = start_eventpipe(work, port, 1, extra)
    wait_ready(f"http://127.0.0.1:{port}/api/v1/s2s/event", proc)
    connection = http.client.HTTPConnection("127.0.0.1", port)
    headers = {"X-Auth-Token": SERVER_KEY, "Content-Type": "application/json"}
    started = time.perf_counter()
    try:
        for path in sorted(source.iterdir()):
            lines = path.read_bytes().splitlines()
            for first in range(0, len(lines), 100):
                body = b"[" + b",".join(lines[first : first + 100]) + b"]"
                connection.request("POST", "/api/v1/s2s/event", body, headers)
                answer = connection.getresponse()
                text = answer.read()
                if answer.status != 200 or b'"ok"' not in text:
                    raise SystemExit(f"the collector answered {answer.status}: {text[:200]!r}")
        seconds = time.perf_counter() - started
    finally:
        connection.close()
        proc.send_signal(signal.SIGTERM)  # a clean stop seals its segments
        proc.wait(60)
    _move_sealed(work, out)
    return seconds


def imported(source: Path, work: Path, out: Path, extra: dict[str, object] | None) -> float:
    """The events of ``source``'s segments brought in by ``eventpipe import`` (its
    function, in this process) under a config with ``extra``; its segments moved to
    ``out``. Returns the seconds the import took."""
    import time

    from eventpipe.collector.imports import import_files
    from eventpipe.config import parse_config

    config = parse_config({"data_dir": str(work / "data"), **(extra or {}),
                           "api_keys": [{"id": "bench", "server": "bench-server-key-123"}]},
                          source="bench")  # fmt: skip
    started = time.perf_counter()
    import_files(config, sorted(source.iterdir()), "bench", fmt="ndjson")
    seconds = time.perf_counter() - started
    _move_sealed(work, out)
    return seconds


def _move_sealed(work: Path, out: Path) -> None:
    """The non-empty segments under ``work``'s data directory moved to ``out``."""
    import shutil

    out.mkdir()
    for segment in (work / "data" / "incoming").glob("incoming.*"):
        if segment.stat().st_size:
            shutil.move(segment, out / segment.name)


def ingest(args: argparse.Namespace) -> None:
    rng = random.Random(1)
    with tempfile.TemporaryDirectory(prefix="eventpipe-contracts-bench-") as tmp:
        work = Path(tmp)
        write_plans(work / "plans")
        bodies = {}
        for per_post in (100, 1):
            events = [make_event(rng) for _ in range(per_post)]
            bodies[per_post] = work / f"body-{per_post}.json"
            bodies[per_post].write_text(json.dumps(events if per_post > 1 else events[0]))
        contracts = {"contracts": {"plans": [str(work / "plans")], "collector": "flag"}}
        servers = {}
        for name, extra in (("without plans", None), ("with 20 plans", contracts)):
            (work / name).mkdir()
            port = free_port()
            [proc] = start_eventpipe(work / name, port, 1, extra)
            url = f"http://127.0.0.1:{port}/api/v1/s2s/event"
            wait_ready(url, proc)
            servers[name] = (proc, url)
        results: dict[tuple[str, int], list[float]] = {}
        try:
            for per_post, body in bodies.items():
                for _, url in servers.values():
                    run_wrk(url, body, 2, args.connections)  # warm-up
                for _ in range(args.rounds):
                    for name, (_, url) in servers.items():
                        rps, _, _, errors = run_wrk(url, body, args.seconds, args.connections)
                        if errors:
                            raise SystemExit(f"{name}: {errors} errors")
                        results.setdefault((name, per_post), []).append(rps * per_post)
            checked = (work / "with 20 plans" / "data" / "incoming").glob("incoming.*")
            line = next(p for p in checked if p.stat().st_size).read_text().splitlines()[0]
            assert json.loads(line)["_eventpipe_checked"]["plan"], "the events were not checked"
        finally:
            for proc, _ in servers.values():
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
    print(f"\n{args.rounds} alternating rounds of {args.seconds} s, one worker, fsync on\n")
    print_alternating(results, list(bodies), "without plans", "with 20 plans",
                      "with plans / without")  # fmt: skip


if __name__ == "__main__":
    main()
