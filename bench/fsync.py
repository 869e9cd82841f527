"""What a durable append costs on this machine's disk, and how the cost grows with writers.

The collector's workers each append a round of events to a file of their own and make it
durable before they answer; this measures that alone, without HTTP, for the ways a round
can be made durable:

* ``fsync``, ``fdatasync``: each writer syncs its own file itself;
* ``process``: each writer hands its file to a sync process of its own over a Unix socket
  and waits for the answer (what a collector worker does: log/syncer.py);
* ``shared``: every writer hands its file to one sync process, which syncs whatever is
  waiting when it is free and answers all of them at once (a commit shared by workers);
* ``syncfs``: like ``shared``, with one ``syncfs`` of the file system for all of them;
* ``none``: the append alone, into the page cache.

Each writer appends ``--round-bytes`` (45,000: 100 events of about 450 bytes) and waits for
its sync, again and again, for ``--seconds``; the methods alternate, once per round of
``--rounds``. Printed: rounds per second of all writers together, MB/s, and the p50/p99 of
a round (append and sync).

    .venv/bin/python bench/fsync.py --writers 1,2,8
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing
import os
import selectors
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

METHODS = ("fsync", "fdatasync", "process", "shared", "syncfs", "none")
ANSWER = struct.Struct("<i")


def serve(socks: list[socket.socket], inherited: list[socket.socket], whole: bool) -> None:
    """A sync process: serves its sockets until they all close. Each request carries one
    descriptor; those waiting together are synced in one go and answered together.
    ``inherited``: the writers' ends, closed here so that their closing is seen;
    ``whole``: one syncfs of the file system instead of an fsync per descriptor."""
    libc = ctypes.CDLL(None, use_errno=True)
    for sock in inherited:
        sock.close()
    selector = selectors.DefaultSelector()
    for sock in socks:
        selector.register(sock, selectors.EVENT_READ)
    open_socks = len(socks)
    while open_socks:
        waiting: list[tuple[socket.socket, int]] = []
        for key, _ in selector.select():
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            message, fds, _, _ = socket.recv_fds(sock, 1, 1)
            if not message:
                selector.unregister(sock)
                open_socks -= 1
                continue
            waiting.append((sock, fds[0]))
        if whole and waiting and libc.syncfs(waiting[0][1]) != 0:
            raise OSError(ctypes.get_errno(), "syncfs failed")
        for _, fd in waiting if not whole else ():
            os.fsync(fd)
        for sock, fd in waiting:
            os.close(fd)
            sock.send(ANSWER.pack(0))


def write_rounds(
    path: Path, method: str, round_bytes: int, seconds: float, sock: socket.socket | None,
    start_at: float, results: multiprocessing.Queue,  # type: ignore[type-arg]
) -> None:  # fmt: skip
    data = (b"x" * 449 + b"\n") * (round_bytes // 450)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    while time.time() < start_at:
        time.sleep(0.001)
    took: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        started = time.perf_counter()
        os.write(fd, data)
        if method == "fsync":
            os.fsync(fd)
        elif method == "fdatasync":
            os.fdatasync(fd)
        elif sock is not None:
            socket.send_fds(sock, [b"S"], [fd])
            sock.recv(ANSWER.size)
        took.append(time.perf_counter() - started)
    os.close(fd)
    if sock is not None:
        sock.close()
    results.put(took)


def measure(
    directory: Path, method: str, writers: int, round_bytes: int, seconds: float
) -> tuple[float, float, float, float]:
    """Rounds/s and MB/s of all writers together, p50 and p99 of a round in ms."""
    context = multiprocessing.get_context("fork")
    results: multiprocessing.Queue = context.Queue()  # type: ignore[type-arg]
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(writers)]
    ours_all = [ours for ours, _ in pairs]
    syncers = []
    if method == "process":
        syncers = [
            context.Process(target=serve, args=([theirs], ours_all, False)) for _, theirs in pairs
        ]
    elif method in ("shared", "syncfs"):
        every = [t for _, t in pairs]
        syncers = [context.Process(target=serve, args=(every, ours_all, method == "syncfs"))]
    for syncer in syncers:
        syncer.start()
    for _, theirs in pairs:
        theirs.close()
    start_at = time.time() + 0.2
    procs = [
        context.Process(
            target=write_rounds,
            args=(
                directory / f"{method}-{n}.log",
                method,
                round_bytes,
                seconds,
                ours if method in ("process", "shared", "syncfs") else None,
                start_at,
                results,
            ),
        )
        for n, (ours, _) in enumerate(pairs)
    ]
    for proc in procs:
        proc.start()
    for ours, _ in pairs:
        ours.close()
    took = [t for _ in procs for t in results.get()]
    for proc in [*procs, *syncers]:
        proc.join()
    for path in directory.iterdir():
        path.unlink()
    rounds_per_s = len(took) / seconds
    ms = sorted(t * 1000 for t in took)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return rounds_per_s, rounds_per_s * round_bytes / 1e6, statistics.median(ms), p99


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--writers", default="1,2", help="writer counts (1,2)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seconds", type=float, default=3.0, help="per method and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--round-bytes", type=int, default=45_000)
    parser.add_argument("--dir", type=Path, help="where the files go (default: a temporary "
                        "folder beside the system's)")  # fmt: skip
    args = parser.parse_args()
    methods = args.methods.split(",")
    counts = [int(n) for n in args.writers.split(",")]
    with tempfile.TemporaryDirectory(prefix="eventpipe-fsync-", dir=args.dir) as tmp:
        results: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {}
        for _ in range(args.rounds):
            for writers in counts:
                for method in methods:
                    results.setdefault((method, writers), []).append(
                        measure(Path(tmp), method, writers, args.round_bytes, args.seconds)
                    )
    print(f"\ndurable appends of {args.round_bytes:,} bytes, {os.cpu_count()} cores, "
          f"{args.rounds} rounds of {args.seconds:g} s each (median shown)\n")  # fmt: skip
    print(f"{'method':<10} {'writers':>7} {'rounds/s':>9} {'MB/s':>7} {'p50 ms':>7} "
          f"{'p99 ms':>7}  rounds/s / 1 writer's")  # fmt: skip
    for (method, writers), rows in results.items():
        rate, mb, p50, p99 = (statistics.median(r[i] for r in rows) for i in range(4))
        one = statistics.median(r[0] for r in results[(method, counts[0])])
        print(f"{method:<10} {writers:>7} {rate:>9.0f} {mb:>7.1f} {p50:>7.2f} {p99:>7.2f}  "
              f"{rate / one:.2f}x")  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    main()
