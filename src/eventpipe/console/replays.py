"""Commands started from the console, each as a process of its own (with its own Spark
session where it needs one: the console never holds one), one at a time per kind and
destination, its outcome (exit code and last lines) kept to be shown:

* ``eventpipe replay failed --destination ID`` (with ``--reason`` and ``--event-id`` for
  a selection);
* ``eventpipe reprocess --destination ID --from DAY --to DAY`` (``--force``), and its
  ``--dry-run``, which says what would be rebuilt and why without Spark;
* ``eventpipe log show --stdin --destination ID``: how one event, as it was stored (in
  the log or the archive; given on standard input), would land in a destination (its
  table and columns, or why it would fail or be filtered), nothing loaded."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

KEPT_LINES = 40
KINDS = ("replay", "reprocess", "preview")


@dataclass
class Replay:
    destination: str
    started: float
    selection: str = "all"
    """What it does, in words."""
    kind: str = "replay"
    """``replay`` or ``reprocess`` (a dry run of a reprocess too)."""
    finished: float | None = None
    exit_code: int | None = None
    output: deque[str] = field(default_factory=lambda: deque(maxlen=KEPT_LINES))

    def as_json(self) -> dict[str, Any]:
        state = "running" if self.exit_code is None else "done" if self.exit_code == 0 else "failed"
        return {"destination": self.destination, "kind": self.kind,
                "selection": self.selection, "state": state, "exit_code": self.exit_code,
                "started": self.started, "finished": self.finished,
                "output": list(self.output)}  # fmt: skip


class Replays:
    def __init__(self, config_path: Path | None) -> None:
        self.config_path = config_path
        self._lock = threading.Lock()
        self._started: dict[tuple[str, str], Replay] = {}

    def start(
        self, destination: str, reason: str | None = None, event_ids: Sequence[str] = ()
    ) -> Replay:
        """Start a replay of ``destination``'s failed events (those of ``reason`` and
        ``event_ids`` where given), unless one runs."""
        args = ["replay", "failed", "--destination", destination]
        chosen = []
        if reason is not None:
            args += ["--reason", reason]
            chosen.append(f"reason {reason!r}")
        for event_id in event_ids:
            args += ["--event-id", event_id]
        if event_ids:
            chosen.append(f"{len(event_ids)} chosen event(s)")
        return self._launch("replay", destination, args, " and ".join(chosen) or "all")

    def reprocess(
        self, destination: str, first: date, last: date, *, force: bool, dry_run: bool
    ) -> Replay:
        """Start ``eventpipe reprocess`` of ``destination``'s days (or its dry run),
        unless one runs."""
        args = ["reprocess", "--destination", destination, "--from", first.isoformat(),
                "--to", last.isoformat()]  # fmt: skip
        what = f"days {first} to {last}" + (", every day (force)" if force else "")
        if force:
            args.append("--force")
        if dry_run:
            args.append("--dry-run")
            what = "a dry run of " + what
        return self._launch("reprocess", destination, args, what)

    def preview(self, destination: str, line: bytes, what: str) -> Replay:
        """Start ``eventpipe log show --stdin --destination`` of an event as it was
        stored (``line``, given on the process's standard input), unless one runs for
        the destination."""
        args = ["log", "show", "--stdin", "--destination", destination]
        return self._launch("preview", destination, args, what, given=line)

    def _launch(
        self, kind: str, destination: str, args: list[str], what: str, given: bytes = b""
    ) -> Replay:
        with self._lock:
            running = self._started.get((kind, destination))
            if running is not None and running.exit_code is None:
                return running
            command = [sys.executable, "-m", "eventpipe.cli", *args]
            if self.config_path is not None:
                command += ["-c", str(self.config_path)]
            launched = Replay(destination, time.time(), what, kind)
            self._started[(kind, destination)] = launched
            process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)  # fmt: skip
            assert process.stdin is not None
            with contextlib.suppress(BrokenPipeError):  # one that failed at once says why
                process.stdin.write(given.decode("utf-8", errors="replace"))
            process.stdin.close()
            threading.Thread(target=self._follow, args=(launched, process), daemon=True).start()
            return launched

    def _follow(self, launched: Replay, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        with process.stdout:
            for line in process.stdout:
                launched.output.append(line.rstrip("\n"))
        launched.exit_code = process.wait()
        launched.finished = time.time()

    def of(self, destination: str, kind: str = "replay") -> Replay | None:
        return self._started.get((kind, destination))

    def all(self) -> list[Replay]:
        return list(self._started.values())
