"""The one retry policy of eventpipe: how long to wait before the next attempt.

Waits double from ``initial`` up to ``maximum``. With ``jitter`` each wait is drawn from
the upper half of its step, so that clients that failed together do not come back
together. A wait is never shorter than what the other side asked for (``Retry-After``),
and never goes past the deadline: ``max_elapsed`` seconds after the first failure, or an
absolute ``deadline`` (wall-clock seconds, shared between processes: a Spark task and
its driver give up at the same moment). Past it, :meth:`Backoff.wait` answers None and
the caller gives up.

What is worth retrying is each caller's to say: a TransientError (errors.retry_transient),
an HTTP status (destinations/http/), a stopped stream query (processing/modes/stream.py).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Backoff:
    initial: float = 1.0
    maximum: float = 60.0
    jitter: bool = True
    max_elapsed: float | None = None
    """Seconds from the first failure (the first :meth:`wait`) after which none is left."""
    deadline: float | None = None
    """Wall-clock time (``time.time()``) after which no wait is left."""
    clock: Callable[[], float] = time.monotonic
    """Measures ``max_elapsed`` (tests give a clock of their own)."""
    _step: float = field(init=False)
    _first_failure: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self._step = self.initial

    def wait(self, retry_after: float = 0.0) -> float | None:
        """Seconds to wait before the next attempt; None: give up (the wait would end
        past the deadline)."""
        now = self.clock()
        if self._first_failure is None:
            self._first_failure = now
        step = self._step
        self._step = min(step * 2, self.maximum)
        wait = max(random.uniform(step / 2, step) if self.jitter else step, retry_after)
        if self.max_elapsed is not None and now - self._first_failure + wait > self.max_elapsed:
            return None
        if self.deadline is not None and time.time() + wait > self.deadline:
            return None
        return wait

    def start(self) -> None:
        """Count ``max_elapsed`` from now (the first attempt) instead of from the first
        failure."""
        self._first_failure = self.clock()

    def elapsed(self) -> float:
        """Seconds since the first failure (0 before it)."""
        return 0.0 if self._first_failure is None else self.clock() - self._first_failure

    def reset(self) -> None:
        """Back to the first step: the failures are over."""
        self._step = self.initial
        self._first_failure = None
