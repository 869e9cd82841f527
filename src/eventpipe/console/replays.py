"""Replays started from the console: ``eventpipe replay failed --destination ID`` (with
``--reason`` and ``--event-id`` for a selection) run as a process of its own (with its own
Spark session: the console never holds one), one at a time per destination, its outcome
(exit code and last lines) kept to be shown."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KEPT_LINES = 40


@dataclass
class Replay:
    destination: str
    started: float
    selection: str = "all"
    """What it replays, in words."""
    finished: float | None = None
    exit_code: int | None = None
    output: deque[str] = field(default_factory=lambda: deque(maxlen=KEPT_LINES))

    def as_json(self) -> dict[str, Any]:
        state = "running" if self.exit_code is None else "done" if self.exit_code == 0 else "failed"
        return {"destination": self.destination, "selection": self.selection,
                "state": state, "exit_code": self.exit_code,
                "started": self.started, "finished": self.finished,
                "output": list(self.output)}  # fmt: skip


class Replays:
    def __init__(self, config_path: Path | None) -> None:
        self.config_path = config_path
        self._lock = threading.Lock()
        self._by_destination: dict[str, Replay] = {}

    def start(
        self, destination: str, reason: str | None = None, event_ids: Sequence[str] = ()
    ) -> Replay:
        """Start a replay of ``destination``'s failed events (those of ``reason`` and
        ``event_ids`` where given), unless one runs."""
        with self._lock:
            running = self._by_destination.get(destination)
            if running is not None and running.exit_code is None:
                return running
            command = [sys.executable, "-m", "eventpipe.cli", "replay", "failed",
                       "--destination", destination]  # fmt: skip
            chosen = []
            if reason is not None:
                command += ["--reason", reason]
                chosen.append(f"reason {reason!r}")
            for event_id in event_ids:
                command += ["--event-id", event_id]
            if event_ids:
                chosen.append(f"{len(event_ids)} chosen event(s)")
            if self.config_path is not None:
                command += ["-c", str(self.config_path)]
            replay = self._by_destination[destination] = Replay(
                destination, time.time(), " and ".join(chosen) or "all"
            )
            process = subprocess.Popen(command, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)  # fmt: skip
            threading.Thread(target=self._follow, args=(replay, process), daemon=True).start()
            return replay

    def _follow(self, replay: Replay, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        with process.stdout:
            for line in process.stdout:
                replay.output.append(line.rstrip("\n"))
        replay.exit_code = process.wait()
        replay.finished = time.time()

    def of(self, destination: str) -> Replay | None:
        return self._by_destination.get(destination)

    def all(self) -> list[Replay]:
        return list(self._by_destination.values())
