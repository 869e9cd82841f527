"""A stream's micro-batches straight through the job, by the width of their events.

    .venv/bin/python bench/micro_batch.py --widths 0,100,300 --batches 20 --rounds 2

One Spark session runs the job of a stream destination into DuckDB
(``process_stream_batch``, what each micro-batch of ``eventpipe run`` calls) on
``--events`` events at a time, each event with ``width`` more keys than the narrow
baseline's three (``event_type``, ``seq``, ``n``); the widths take turns, ``--batches``
micro-batches each per round. What the driver does for every micro-batch (building the
plans through Py4J, Catalyst analysing them, the Spark job, the load) grows with the
columns, not the rows: the bench prints each width's median micro-batch (the first
``--warm`` of each width's first round left out) and its ratio to the baseline, and with
``--count-calls`` the calls from Python into the JVM in the last micro-batch, by kind.
``--changes`` makes the events changes as a PostgreSQL source writes them (a
``timestamptz`` column, the commit time; docs/cdc.md), ``--events 40`` about what a
micro-batch of bench/cdc.py's latency run holds.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--widths", default="0,100,300", help="keys beside the baseline's")
    parser.add_argument("--events", type=int, default=1000, help="events per micro-batch")
    parser.add_argument("--batches", type=int, default=20, help="per width and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warm", type=int, default=5, help="left out of the first round")
    parser.add_argument("--count-calls", action="store_true")
    parser.add_argument(
        "--nested", action="store_true",
        help="the keys half under context, half under properties (as bench/stream.py "
        "--width), instead of at the top",
    )  # fmt: skip
    parser.add_argument(
        "--changes", action="store_true",
        help="events as a PostgreSQL source writes them (bench/cdc.py's latency table: "
        "an int key and a timestamptz, the change's _op, _namespace, _lsn, _seq, _key, "
        "_commit_time), the width's keys beside them; the template {{ _namespace }}",
    )  # fmt: skip
    parser.add_argument("--template", default="events",
                        help="the destinations' table_name_template (the baseline's "
                        "events all have the event_type tick: {{ event_type }})")  # fmt: skip
    args = parser.parse_args()
    widths = [int(w) for w in args.widths.split(",")]

    from eventpipe.collector.enrich import EnrichSettings, RequestContext, enrich_batch
    from eventpipe.config import parse_config
    from eventpipe.processing.batch.job import process_stream_batch
    from eventpipe.processing.batch.schema_cache import SchemaCache
    from eventpipe.processing.runtime.pipeline import Runtime
    from eventpipe.processing.runtime.spark import start_session

    calls: collections.Counter[str] = collections.Counter()
    if args.count_calls:
        _count_calls(calls)
    work = Path(tempfile.mkdtemp(prefix="eventpipe-micro-batch-"))
    destinations = {
        f"w{w}": {
            "type": "duckdb",
            "mode": "stream",
            "path": str(work / f"w{w}.duckdb"),
            "table_name_template": "{{ _namespace }}" if args.changes else args.template,
        }
        for w in widths
    }
    config = parse_config(
        {"data_dir": str(work / "data"), "destinations": destinations}, source="bench"
    )
    spark = start_session(config.spark.settings)
    now = datetime.now(UTC)
    ctx = RequestContext(key_id="bench", browser=False, source_ip="127.0.0.1", user_agent=None,
                         received_at=now, timestamp=now.isoformat())  # fmt: skip
    settings = EnrichSettings(max_event_bytes=1 << 20, anonymize_ip=False)
    runtimes = {w: Runtime(config, spark).only([f"w{w}"]) for w in widths}
    schemas = {w: SchemaCache() for w in widths}
    epochs = dict.fromkeys(widths, 0)
    times: dict[int, list[float]] = {w: [] for w in widths}

    def micro_batch(width: int) -> float:
        epoch = epochs[width]
        epochs[width] += 1

        def wide(k: int) -> dict[str, Any]:
            if not args.nested:
                return {f"p{j}": j + k for j in range(width)}
            return nested_keys(width, k)

        first = epoch * args.events
        items: list[Any] = [
            change(first + k, **wide(k)) if args.changes else
            {"event_type": "tick", "seq": first + k, "n": k % 10, **wide(k)}
            for k in range(args.events)
        ]  # fmt: skip
        path = work / f"w{width}-{epoch}.jsonl"
        if args.changes:  # written by the source as they are: no collector, no address
            path.write_bytes(b"".join(orjson.dumps(item, option=orjson.OPT_APPEND_NEWLINE)
                                      for item in items))  # fmt: skip
        else:
            path.write_bytes(b"".join(enrich_batch(items, ctx, settings).lines))
        calls.clear()
        started = time.perf_counter()
        process_stream_batch(runtimes[width], epoch, [path], schemas[width])
        return time.perf_counter() - started

    for round_ in range(args.rounds):
        for width in widths:
            taken = [micro_batch(width) for _ in range(args.batches)]
            times[width] += taken[args.warm :] if round_ == 0 else taken
            print(f"round {round_ + 1}, width {width}: median {statistics.median(taken):.3f} s")
    base = statistics.median(times[widths[0]])
    print(f"\n{args.events} events per micro-batch, medians over {args.rounds} round(s):")
    for width in widths:
        median = statistics.median(times[width])
        print(f"  {width + 3:4d} keys: {median:.3f} s per micro-batch "
              f"({median / base:.2f}x the {widths[0] + 3}-key baseline)")  # fmt: skip
    if args.count_calls:
        print(f"calls into the JVM in the last micro-batch (width {widths[-1]}): "
              f"{sum(calls.values())}")  # fmt: skip
        for kind, count in calls.most_common(12):
            print(f"  {count:6d} {kind}")
    spark.stop()


def change(n: int, **row: Any) -> dict[str, Any]:
    """The insert of row ``n`` of ``public.ticks`` (id, at timestamptz) as a PostgreSQL
    source's event (sources/postgres/reader.py), ``row``'s keys beside its columns."""
    at = datetime.now(UTC).isoformat(timespec="microseconds")  # timestamptz as JSON text
    return {"id": n, "at": at, **row, "_namespace": "public.ticks", "_lsn": 10**8 + n,
            "_seq": 1, "_op": "insert", "_key": f"[{n}]", "_commit_time": at[:-6] + "Z",
            "_timestamp": at[:-6] + "Z", "src": "postgres", "api_key": "pg",
            "eventn_ctx": {"event_id": str(uuid.uuid4())}}  # fmt: skip


def nested_keys(width: int, k: int = 0) -> dict[str, Any]:
    """``width`` keys as an SDK's event nests them: half under ``context`` (text), half
    under ``properties`` (numbers from ``k``). bench/stream.py --width sends the same."""
    half = width // 2
    return {"context": {f"c{j}": f"value {j}" for j in range(half)},
            "properties": {f"p{j}": j + k for j in range(width - half)}}  # fmt: skip


def _count_calls(calls: collections.Counter[str]) -> None:
    """Count every command Py4J sends, by kind (a call: by method)."""
    from py4j import clientserver

    send = clientserver.ClientServerConnection.send_command

    def counting(self: Any, command: str) -> Any:
        parts = command.split("\n")
        calls[f"call {parts[2]}" if parts[0] == "c" and len(parts) > 2 else parts[0]] += 1
        return send(self, command)

    clientserver.ClientServerConnection.send_command = counting  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
