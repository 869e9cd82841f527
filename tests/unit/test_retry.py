"""The one retry policy: doubling waits with jitter, Retry-After, and a deadline."""

from __future__ import annotations

import time

from eventpipe.retry import Backoff


def test_waits_double_up_to_the_maximum_without_jitter() -> None:
    backoff = Backoff(1.0, 5.0, jitter=False)
    assert [backoff.wait() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    backoff.reset()
    assert backoff.wait() == 1.0


def test_jitter_draws_each_wait_from_the_upper_half_of_its_step() -> None:
    waits = [Backoff(4.0, 60.0).wait() for _ in range(200)]
    assert all(w is not None and 2.0 <= w <= 4.0 for w in waits)
    assert len({round(w or 0, 6) for w in waits}) > 100  # not one fixed value


def test_retry_after_is_a_floor() -> None:
    backoff = Backoff(1.0, 60.0)
    assert backoff.wait(retry_after=30.0) == 30.0


def test_max_elapsed_counts_from_the_first_failure_or_from_start() -> None:
    now = [100.0]
    backoff = Backoff(1.0, 60.0, jitter=False, max_elapsed=10.0, clock=lambda: now[0])
    assert backoff.wait() == 1.0  # the first failure: the clock starts
    now[0] += 5.0
    assert backoff.wait() == 2.0  # 5 + 2 <= 10
    now[0] += 4.0
    assert backoff.wait() is None  # 9 + 4 > 10: give up
    started = Backoff(1.0, 60.0, jitter=False, max_elapsed=10.0, clock=lambda: now[0])
    started.start()
    now[0] += 9.5
    assert started.elapsed() == 9.5
    assert started.wait() is None  # counted from the first attempt


def test_an_absolute_deadline_is_shared_by_wall_clock() -> None:
    assert Backoff(1.0, 60.0, jitter=False, deadline=time.time() + 30).wait() == 1.0
    assert Backoff(1.0, 60.0, jitter=False, deadline=time.time() + 0.5).wait() is None
