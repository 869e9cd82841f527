"""The console beside ingest: the collector's events/s (bench/ingest.py's events, wrk, one
worker, fsync on) with the console's live view open (a client reading
``/api/events/stream`` and ``/api/overview/stream`` all along) and without it, in one
run, alternating rounds; then the console process's memory (peak RSS) after the run.

On a machine where wrk, the collector and the console share two cores, rounds of the
same case differ by 30%; so each round also counts the CPU time the collector (its worker
and fsync process) and the console spent, per event. The collector's CPU per event with
the view open against without it is what the view costs ingest where the collector has a
core of its own; adding the console's CPU to the open side is what it costs where the
console takes its CPU from the collector's core.

    .venv/bin/python bench/console.py --seconds 8 --rounds 3

The goal: at least 0.95x the events/s with the live view open.

``--soak SECONDS`` instead: the console's memory over a long stream, its live view and
overview open all along, while ``--rate`` events/s (100-event posts, paced) arrive; the
console's RSS printed each minute (the goal: under 150 MB after an hour of 1,000/s).

    .venv/bin/python bench/console.py --soak 3600 --rate 1000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest import (
    SERVER_KEY,
    free_port,
    make_event,
    peak_rss_mb,
    print_alternating,
    run_wrk,
    start_eventpipe,
    wait_ready,
)

TOKEN = "bench-console-token-0123456789abcdef"
WATCH_SECONDS = 5  # eventpipe.collector.received.WATCH_SECONDS


class Viewer:
    """A browser's live view and overview: two server-sent event streams, read along."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.events = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._read, args=(path,), daemon=True)
                         for path in ("/api/events/stream", "/api/overview/stream")]  # fmt: skip

    def __enter__(self) -> Viewer:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def _read(self, path: str) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.stream("GET", self.url + path, headers=headers, timeout=None) as stream:
            for line in stream.iter_lines():
                if line.startswith("event: event"):
                    self.events += 1
                if self._stop.is_set():
                    return


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--soak", type=int, default=0, help="seconds of a paced stream instead")
    parser.add_argument("--rate", type=int, default=1000, help="events/s of --soak")
    args = parser.parse_args()
    if args.soak:
        soak(args.soak, args.rate)
        return
    rng = random.Random(1)
    with tempfile.TemporaryDirectory(prefix="eventpipe-console-bench-") as tmp:
        work = Path(tmp)
        bodies = {}
        for per_post in (100, 1):
            events = [make_event(rng) for _ in range(per_post)]
            bodies[per_post] = work / f"body-{per_post}.json"
            bodies[per_post].write_text(json.dumps(events if per_post > 1 else events[0]))
        collector, url, served, viewer_url = _start(work, sample_seconds=1)
        results: dict[tuple[str, int], list[float]] = {}
        cpu_used: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
        shown = 0
        try:
            _wait_console(viewer_url, served)
            for per_post, body in bodies.items():
                run_wrk(url, body, 2, args.connections)  # warm-up
                for _ in range(args.rounds):
                    for name in ("console closed", "live view open"):
                        viewer = Viewer(viewer_url) if name == "live view open" else None
                        with viewer or contextlib.nullcontext():
                            # A view takes a moment to open; the collector samples for a
                            # while after the view's last poll.
                            time.sleep(0.5 if viewer else WATCH_SECONDS + 1)
                            before = _family_cpu(collector.pid), _family_cpu(served.pid)
                            rps, _, _, errors = run_wrk(url, body, args.seconds, args.connections)
                            after = _family_cpu(collector.pid), _family_cpu(served.pid)
                        if viewer is not None:
                            shown += viewer.events
                        if errors:
                            raise SystemExit(f"{name}: {errors} errors")
                        events = rps * per_post * args.seconds
                        results.setdefault((name, per_post), []).append(rps * per_post)
                        cpu_used.setdefault((name, per_post), []).append(
                            (events, after[0] - before[0], after[1] - before[1])
                        )
            rss = peak_rss_mb([served.pid])
            cpu = _family_cpu(served.pid)
        finally:
            for proc in (served, collector):
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
    print(f"\n{args.rounds} alternating rounds of {args.seconds} s, one collector worker, "
          "fsync on\n")  # fmt: skip
    print_alternating(results, list(bodies), "console closed", "live view open", "open / closed")
    print_cpu(cpu_used, list(bodies))
    open_seconds = args.seconds * args.rounds * len(bodies)
    print(f"the live view showed {shown:,} event(s); the console's peak RSS {rss:.0f} MB; "
          f"its CPU {cpu:.1f} s in all (the live view was open {open_seconds} s)")  # fmt: skip


def print_cpu(used: dict[tuple[str, int], list[tuple[float, float, float]]],
              sizes: list[int]) -> None:  # fmt: skip
    """Per post size: the collector's and the console's CPU per event, medians of the
    rounds, and what the view costs ingest by CPU (see the module's docstring)."""
    for per_post in sizes:
        per_event = {}
        for name in ("console closed", "live view open"):
            rounds = used[(name, per_post)]
            collector = statistics.median(c / e * 1e6 for e, c, _ in rounds)
            console = statistics.median(v / e * 1e6 for e, _, v in rounds)
            per_event[name] = collector, console
            print(f"{per_post:>3} events/post, {name}: collector {collector:.2f} us of CPU "
                  f"per event, console {console:.2f} us")  # fmt: skip
        closed, _ = per_event["console closed"]
        collector, console = per_event["live view open"]
        paired = sorted(  # each open round against the closed round before it
            (c / e) / (o / f)
            for (e, c, _), (f, o, _) in zip(used[("console closed", per_post)],
                                            used[("live view open", per_post)], strict=True)
        )  # fmt: skip
        print(f"{per_post:>3} events/post: by CPU, open / closed = {closed / collector:.3f}x "
              f"(the collector on a core of its own; round by round, median "
              f"{statistics.median(paired):.3f}x, {paired[0]:.2f}-{paired[-1]:.2f}), "
              f"{closed / (collector + console):.3f}x (the console's CPU taken from the "
              "collector's)\n")  # fmt: skip


def _family_cpu(pid: int) -> float:
    """User and system CPU seconds of a process and its children so far."""
    process = psutil.Process(pid)
    total = 0.0
    for member in (process, *process.children(recursive=True)):
        with contextlib.suppress(psutil.Error):
            times = member.cpu_times()
            total += times.user + times.system
    return total


def soak(seconds: int, rate: int) -> None:
    """The console's RSS each minute of a stream of ``rate`` events/s."""
    rng = random.Random(1)
    with tempfile.TemporaryDirectory(prefix="eventpipe-console-soak-") as tmp:
        work = Path(tmp)
        collector, url, served, viewer_url = _start(work)
        bodies = [json.dumps([make_event(rng) for _ in range(100)]).encode() for _ in range(20)]
        headers = {"X-Auth-Token": SERVER_KEY, "Content-Type": "application/json"}
        sent, started = 0, time.monotonic()
        try:
            _wait_console(viewer_url, served)
            with Viewer(viewer_url) as viewer, httpx.Client(headers=headers) as client:
                next_report = started + 60
                print("minute  events sent  shown live  console RSS MB", flush=True)
                while (now := time.monotonic()) < started + seconds:
                    due = int((now - started) * rate)
                    while sent + 100 <= due:
                        client.post(
                            url, content=bodies[(sent // 100) % len(bodies)]
                        ).raise_for_status()
                        sent += 100
                    if now >= next_report:
                        print(f"{(now - started) / 60:6.0f}  {sent:11,}  {viewer.events:10,}  "
                              f"{_rss_mb(served.pid):14.1f}", flush=True)  # fmt: skip
                        next_report += 60
                    time.sleep(0.02)
            rss, cpu = _rss_mb(served.pid), _family_cpu(served.pid)
            peak = peak_rss_mb([served.pid])
        finally:
            for proc in (served, collector):
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
    print(f"\n{sent:,} events in {seconds} s ({sent / seconds:,.0f}/s): the console's RSS "
          f"{rss:.0f} MB at the end, peak {peak:.0f} MB, CPU {cpu:.0f} s")  # fmt: skip


def _start(
    work: Path, **settings: float
) -> tuple[subprocess.Popen[bytes], str, subprocess.Popen[bytes], str]:
    """A collector (one worker) and ``eventpipe console`` beside it: (the collector, its
    event URL, the console, the console's URL)."""
    port, console_port = free_port(), free_port()
    console = {"console": {"token": TOKEN, "port": console_port, **settings}}
    [collector] = start_eventpipe(work, port, 1, console)
    url = f"http://127.0.0.1:{port}/api/v1/s2s/event"
    wait_ready(url, collector)
    command = [str(Path(sys.executable).parent / "eventpipe"), "console", "-c",
               str(work / "eventpipe.yaml")]  # fmt: skip
    served = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return collector, url, served, f"http://127.0.0.1:{console_port}"


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _wait_console(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("the console exited")
        try:
            httpx.get(url + "/login", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit("the console did not start")


if __name__ == "__main__":
    main()
