"""Bulk import: ``eventpipe import`` of one NDJSON file of 1M events against the floor,
``cat`` of the same file onto the log's disk followed by an fsync, in one run.

    .venv/bin/python bench/import.py --events 1000000

The events are bench/batch.py's (nested, ~460 bytes); a few lines in 100,000 are not
JSON, as in a real export. eventpipe reads, checks, enriches (an id derived from each
event's content, the key, a timestamp) and appends to the log with an fsync every
10,000 events; the floor only copies bytes. Prints seconds, events/s and the ratio.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from batch import make_event, user_agents  # noqa: E402 - bench/, the script's directory


def write_events(path: Path, events: int) -> int:
    rng = random.Random(11)
    agents = user_agents(rng)
    bad = 0
    with path.open("wb") as out:
        for n in range(events):
            if rng.random() < 3e-5:
                out.write(b'{"broken": \n')
                bad += 1
            else:
                out.write(orjson.dumps(make_event(rng, n, agents)) + b"\n")
    return bad


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="eventpipe-import-bench-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        source = work / "export" / "events.ndjson"
        source.parent.mkdir()
        bad = write_events(source, args.events)
        size = source.stat().st_size
        print(f"{args.events:,} lines ({bad} not JSON), {size / 1e6:.0f} MB", flush=True)

        floor_dir = work / "floor"
        floor_dir.mkdir()
        started = time.perf_counter()
        subprocess.run(f"cat {source} > {floor_dir / 'copy.log'}", shell=True, check=True)
        descriptor = os.open(floor_dir / "copy.log", os.O_RDONLY)
        os.fsync(descriptor)
        os.close(descriptor)
        floor = time.perf_counter() - started

        config = work / "eventpipe.yaml"
        config.write_text(f"data_dir: {work / 'data'}\n"
                          "api_keys: [{id: web, server: s2s-bench-secret-1}]\n")  # fmt: skip
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "eventpipe.cli", "import", str(source),
                               "--key", "web", "-c", str(config)],
                              capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src")})  # fmt: skip
        ours = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(done.stderr[-2000:])
        print(done.stdout.strip().splitlines()[0])
        shutil.rmtree(work / "data", ignore_errors=True)

    print(f"\n{'':44} {'s':>7} {'events/s':>11} {'MB/s':>7}")
    for label, seconds in (("cat + fsync (the floor)", floor),
                           ("eventpipe import (process start included)", ours)):  # fmt: skip
        print(f"{label:44} {seconds:7.1f} {args.events / seconds:11,.0f} "
              f"{size / 1e6 / seconds:7.0f}")  # fmt: skip
    print(f"\neventpipe import / floor: {ours / floor:.1f}x the time")


if __name__ == "__main__":
    main()
