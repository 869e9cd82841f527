"""Ingest benchmark: eventpipe's collector next to a bare baseline, in the same run, with
one worker process and with several (``--workers 1,2``: ``server.workers``; the baseline
as as many processes sharing the port with ``SO_REUSEPORT``, as eventpipe's workers do).

Both servers run on uvicorn with uvloop and httptools on 127.0.0.1; `wrk` (C, one thread)
drives each with 16 connections, first with 100-event posts, then with single-event posts.
eventpipe runs with its real settings: key check, enrichment, limits, fsync before 200.
The baseline only parses and appends (bench/baseline_server.py). wrk runs on the same
machine: on 2 cores its thread takes part of the second core the second worker needs.

    make bench                         # or: .venv/bin/python bench/ingest.py --seconds 15

``--fsync on,off`` adds eventpipe with ``incoming.fsync: false`` (``eventpipe-nosync``)
to the same run, to show what durability costs at each worker count.

Prints events/s, p50/p99 latency, peak RSS (all processes of a server), and the ratios:
eventpipe to the baseline with as many workers, and N workers to one. The Segment API
(``segment-1w``: the same events as track messages in ``/v1/batch`` bodies, with HTTP
Basic auth) runs on the one-worker eventpipe server, beside its native endpoint.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import functools
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
SERVER_KEY = "bench-server-key-123"
USER_AGENTS = [
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0.0.0 Safari/537.36",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 "
    "(KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
]


def make_event(rng: random.Random) -> dict[str, object]:
    """A realistic analytics event (~450 bytes of JSON), no id: the collector makes one."""
    return {
        "event_type": rng.choice(["page_view", "click", "signup", "purchase"]),
        "user": {"anonymous_id": f"a{rng.getrandbits(48):x}", "id": rng.randint(1, 10**6)},
        "page": {
            "url": f"https://shop.example.com/p/{rng.randint(1, 5000)}",
            "title": "Product page",
            "referrer": "https://www.google.com/",
        },
        "properties": {
            "price": round(rng.uniform(1, 500), 2),
            "currency": "EUR",
            "items": rng.randint(1, 5),
            "coupon": rng.choice([None, "WINTER", True]),
        },
        "user_agent": rng.choice(USER_AGENTS),
        "screen": {"w": 1920, "h": 1080},
    }


@dataclass
class Result:
    name: str
    events_per_post: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    peak_rss_mb: float | None = None
    rounds: Rounds | None = None

    @property
    def events_per_s(self) -> float:
        return self.requests_per_s * self.events_per_post


@dataclass
class Rounds:
    """eventpipe's group-commit rounds during one wrk run, from its /metrics (all workers)."""

    count: float
    sync_seconds: float
    wait_seconds: float
    appends: float

    @classmethod
    def read(cls, url: str) -> Rounds:
        base = url.split("/", 3)[:3]
        text = httpx.get("/".join(base) + "/metrics", timeout=10).text
        series = dict(line.rsplit(" ", 1) for line in text.splitlines() if line[:1] != "#")
        return cls(
            *(float(series.get(name, 0)) for name in (
                "eventpipe_log_fsync_seconds_count", "eventpipe_log_fsync_seconds_sum",
                "eventpipe_log_round_wait_seconds_sum", "eventpipe_log_round_appends_total",
            ))
        )  # fmt: skip

    def __sub__(self, earlier: Rounds) -> Rounds:
        return Rounds(
            self.count - earlier.count,
            self.sync_seconds - earlier.sync_seconds,
            self.wait_seconds - earlier.wait_seconds,
            self.appends - earlier.appends,
        )


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            httpx.post(url, content=b"[]", headers={"X-Auth-Token": SERVER_KEY}, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not start")


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def run_wrk(
    url: str, body_path: Path, seconds: int, connections: int, threads: int = 1
) -> tuple[float, float, float, int]:
    """wrk against ``url``: the Segment API's paths (``/v1/...``) with the body's Segment
    form (``<body>.segment``) and the key as HTTP Basic auth, as the SDKs send."""
    segment = urllib.parse.urlparse(url).path.startswith("/v1/")
    if segment:
        body_path = body_path.with_suffix(".segment")
    auth = ("Authorization", "Basic " + base64.b64encode(f"{SERVER_KEY}:".encode()).decode())
    header = auth if segment else ("X-Auth-Token", SERVER_KEY)
    script = body_path.with_suffix(".lua" if not segment else ".segment.lua")
    script.write_text(
        f'wrk.method = "POST"\n'
        f'wrk.body = io.open("{body_path}", "rb"):read("*a")\n'
        f'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["{header[0]}"] = "{header[1]}"\n'
    )
    out = subprocess.run(
        [
            "wrk",
            f"-t{threads}",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"\s50%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"\s99%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    errors_match = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out
    )
    errors = int(errors_match.group(1)) if errors_match else 0
    if socket_errors:
        errors += sum(int(x) for x in socket_errors.groups())
    return rps, p50, p99, errors


def peak_rss_mb(pids: list[int]) -> float:
    """The peak RSS of processes and their children, added up."""
    total = 0.0
    for pid in pids:
        children = Path(f"/proc/{pid}/task/{pid}/children")
        family = [pid, *(int(c) for c in children.read_text().split())]
        for member in family:
            status = Path(f"/proc/{member}/status").read_text()
            total += int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024  # type: ignore[union-attr]
    return total


def print_alternating(
    results: dict[tuple[str, int], list[float]],
    sizes: list[int],
    base: str,
    other: str,
    ratio_name: str,
) -> None:
    """Per post size, each side's median events/s over its rounds (and the rounds), and
    ``other`` / ``base`` as ``ratio_name``."""
    for per_post in sizes:
        medians = {}
        for name in (base, other):
            rounds = results[(name, per_post)]
            medians[name] = statistics.median(rounds)
            each = ", ".join(f"{r:,.0f}" for r in rounds)
            print(f"{per_post:>3} events/post, {name}: {medians[name]:,.0f} events/s ({each})")
        ratio = medians[other] / medians[base]
        # Each round of ``other`` beside the round of ``base`` just before it: a ratio
        # that the machine's drift over the run does not move.
        paired = sorted(o / b for b, o in zip(results[(base, per_post)],
                                              results[(other, per_post)], strict=True))  # fmt: skip
        spread = f"{paired[0]:.2f}-{paired[-1]:.2f}"
        print(f"{per_post:>3} events/post: {ratio_name} = {ratio:.2f}x events/s; round by "
              f"round, median {statistics.median(paired):.2f}x ({spread})\n")  # fmt: skip


def eventpipe_command() -> list[str]:
    """The ``eventpipe`` beside this interpreter, or the CLI's module where eventpipe runs
    from a checkout (``PYTHONPATH=src``) without being installed."""
    script = Path(sys.executable).parent / "eventpipe"
    return [str(script)] if script.exists() else [sys.executable, "-m", "eventpipe.cli"]


def start_eventpipe(
    work: Path,
    port: int,
    workers: int,
    extra: dict[str, object] | None = None,
    *,
    fsync: bool = True,
) -> list[subprocess.Popen[bytes]]:
    """``eventpipe collect`` with the benchmark's settings (``extra``: more sections)."""
    config: dict[str, object] = {
        "data_dir": str(work / "data"),
        "server": {"host": "127.0.0.1", "port": port, "workers": workers},
        "incoming": {
            "max_backlog_bytes": 10**12,
            "min_free_disk_bytes": 10**8,
            "fsync": fsync,
        },
        "api_keys": [{"id": "bench", "js": "bench-js-key-123", "server": SERVER_KEY}],
        "logging": {"level": "warning"},
        **(extra or {}),
    }
    path = work / "eventpipe.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [*eventpipe_command(), "collect", "-c", str(path)]
    return [subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]


def start_baseline(work: Path, port: int, workers: int) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "bench/baseline_server.py"),
                "--port",
                str(port),
                "--out",
                str(work / f"baseline-{n}.jsonl"),
                "--reuse-port",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for n in range(workers)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=8, help="measured seconds per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per case")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--threads", type=int, default=1, help="wrk's threads")
    parser.add_argument("--workers", default="1,2", help="worker counts compared (1,2)")
    parser.add_argument("--fsync", default="on", help="eventpipe with fsync on, off, or on,off")
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    fsyncs = args.fsync.split(",")
    if not fsyncs or set(fsyncs) - {"on", "off"}:
        parser.error("--fsync takes on, off or on,off")
    kinds = [("baseline", start_baseline)]
    if "on" in fsyncs:
        kinds.append(("eventpipe", start_eventpipe))
    if "off" in fsyncs:
        kinds.append(("eventpipe-nosync", functools.partial(start_eventpipe, fsync=False)))
    if shutil.which("wrk") is None:
        sys.exit("wrk is needed: apt-get install wrk (make bench does it)")

    rng = random.Random(1)
    with tempfile.TemporaryDirectory(prefix="eventpipe-bench-") as tmp:
        work = Path(tmp)
        bodies = {}
        for per_post in (100, 1):
            events = [make_event(rng) for _ in range(per_post)]
            body = work / f"body-{per_post}.json"
            body.write_bytes(json.dumps(events if per_post > 1 else events[0]).encode())
            bodies[per_post] = body
            # The same events as Segment track messages, in a batch, for /v1/batch.
            tracks = [
                {
                    "type": "track",
                    "event": e["event_type"],
                    "anonymousId": e["user"]["anonymous_id"],
                    "properties": e,
                }
                for e in events
            ]  # type: ignore[index]
            body.with_suffix(".segment").write_bytes(json.dumps({"batch": tracks}).encode())
        servers: dict[str, tuple[list[subprocess.Popen[bytes]], str]] = {}
        for workers in counts:
            for kind, starter in kinds:
                name = f"{kind}-{workers}w"
                (work / name).mkdir()
                port = free_port()
                procs = starter(work / name, port, workers)
                url = f"http://127.0.0.1:{port}/api/v1/s2s/event"
                for proc in procs:
                    wait_ready(url, proc)
                servers[name] = (procs, url)
                if kind == kinds[1][0] and workers == counts[0]:  # the Segment API's cost
                    servers[f"segment-{workers}w"] = (procs, url.replace("/api/v1/s2s/event",
                                                                         "/v1/batch"))  # fmt: skip
        results: dict[tuple[str, int], list[Result]] = {}
        try:
            # Rounds alternate between the servers, so that drifts of this shared machine
            # (page cache, writeback, noisy neighbours) hit all alike.
            for per_post, body in bodies.items():
                for _, url in servers.values():
                    run_wrk(url, body, 2, args.connections, args.threads)  # warm-up
                for _ in range(args.rounds):
                    for name, (procs, url) in servers.items():
                        ours = not name.startswith("baseline")
                        before = Rounds.read(url) if ours else None
                        rps, p50, p99, errors = run_wrk(
                            url, body, args.seconds, args.connections, args.threads
                        )
                        rounds = Rounds.read(url) - before if before is not None else None
                        rss = peak_rss_mb([p.pid for p in procs])
                        results.setdefault((name, per_post), []).append(
                            Result(name, per_post, rps, p50, p99, errors, rss, rounds)
                        )
        finally:
            for procs, _ in servers.values():
                for proc in procs:
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGTERM)
                for proc in procs:
                    proc.wait(60)
        stored = sum(
            1
            for workers in counts
            for kind, _ in kinds[1:]
            for p in (work / f"{kind}-{workers}w/data/incoming").iterdir()
            if p.name.startswith("incoming.")
        )

    print(
        f"\ningest, {args.connections} connections, {args.rounds} alternating rounds of "
        f"{args.seconds} s per case (median shown), {os.cpu_count()} cores, "
        f"wrk -t{args.threads} on the same machine\n"
    )
    print(
        f"{'server':<20} {'events/post':>11} {'events/s':>10} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'errors':>7} {'peak RSS MB':>12}   events/s of each round"
    )
    medians = {}
    for (name, per_post), rounds in results.items():
        m = Result(
            name,
            per_post,
            statistics.median(r.requests_per_s for r in rounds),
            statistics.median(r.p50_ms for r in rounds),
            statistics.median(r.p99_ms for r in rounds),
            sum(r.errors for r in rounds),
            max(r.peak_rss_mb or 0 for r in rounds),
        )
        medians[(name, per_post)] = m
        each = ", ".join(f"{r.events_per_s:.0f}" for r in rounds)
        print(
            f"{name:<20} {per_post:>11} {m.events_per_s:>10.0f} {m.p50_ms:>8.2f} "
            f"{m.p99_ms:>8.2f} {m.errors:>7} {m.peak_rss_mb or 0:>12.1f}   {each}"
        )
    print(
        "\ngroup commit (eventpipe with fsync on; median of the rounds): rounds/s of all "
        "workers, requests per round, a round's syncs and its wait (the hand-off to the "
        "fsync process and back included), ms on average\n"
    )
    print(f"{'server':<20} {'events/post':>11} {'rounds/s':>9} {'req/round':>9} "
          f"{'sync ms':>8} {'wait ms':>8} {'hand-off ms':>11}")  # fmt: skip
    for (name, per_post), rounds in results.items():
        measured = [r.rounds for r in rounds if r.rounds is not None and r.rounds.count > 0]
        if not measured:
            continue
        rate = statistics.median(m.count / args.seconds for m in measured)
        per_round = statistics.median(m.appends / m.count for m in measured)
        sync_ms = statistics.median(m.sync_seconds / m.count * 1000 for m in measured)
        wait_ms = statistics.median(m.wait_seconds / m.count * 1000 for m in measured)
        print(f"{name:<20} {per_post:>11} {rate:>9.0f} {per_round:>9.1f} {sync_ms:>8.3f} "
              f"{wait_ms:>8.3f} {wait_ms - sync_ms:>11.3f}")  # fmt: skip
    print()
    for per_post in bodies:
        for workers in counts:
            bare = medians[(f"baseline-{workers}w", per_post)].events_per_s
            for kind, _ in kinds[1:]:
                ours = medians[(f"{kind}-{workers}w", per_post)].events_per_s
                print(f"{per_post:>3} events/post, {workers} worker(s): {kind} / baseline = "
                      f"{ours / bare:.2f}x events/s")  # fmt: skip
        for workers in counts[1:]:
            for kind, _ in kinds:
                scale = (medians[(f"{kind}-{workers}w", per_post)].events_per_s
                         / medians[(f"{kind}-{counts[0]}w", per_post)].events_per_s)  # fmt: skip
                print(f"{per_post:>3} events/post, {kind}: {workers} workers / {counts[0]} = "
                      f"{scale:.2f}x events/s")  # fmt: skip
        segment = medians.get((f"segment-{counts[0]}w", per_post))
        if segment is not None:
            native = medians[(f"{kinds[1][0]}-{counts[0]}w", per_post)].events_per_s
            cost = native / segment.events_per_s
            print(f"{per_post:>3} events/post, {counts[0]} worker(s): Segment /v1/batch "
                  f"costs {cost:.2f}x the native endpoint per event")  # fmt: skip
    print(f"eventpipe sealed {stored} segment file(s)")
    if args.json:
        args.json.write_text(
            json.dumps(
                [dataclasses.asdict(r) for rounds in results.values() for r in rounds], indent=2
            )
        )


if __name__ == "__main__":
    main()
