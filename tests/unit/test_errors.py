"""Transient failures are retried with a doubling delay; others are not."""

from __future__ import annotations

import pytest

from eventpipe.errors import TerminalError, TransientError, retry_transient


class Busy(TransientError):
    pass


def test_transient_failures_are_retried_with_doubling_delays_up_to_the_cap() -> None:
    calls: list[int] = []
    waits: list[float] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 5:
            raise TransientError("connection lost")
        return "done"

    assert retry_transient(flaky, attempts=None, max_delay=5, sleep=waits.append) == "done"
    assert waits == [1.0, 2.0, 4.0, 5.0]


def test_attempts_run_out_and_other_errors_pass_at_once() -> None:
    waits: list[float] = []

    def down() -> None:
        raise TransientError("server down")

    with pytest.raises(TransientError, match="server down"):
        retry_transient(down, attempts=3, sleep=waits.append)
    assert waits == [1.0, 2.0]

    def broken() -> None:
        raise TerminalError("bad data")

    with pytest.raises(TerminalError):
        retry_transient(broken, attempts=3, sleep=waits.append)

    def busy() -> None:
        raise Busy("another pipeline")

    with pytest.raises(Busy):
        retry_transient(busy, attempts=3, sleep=waits.append, unless=(Busy,))
    assert waits == [1.0, 2.0]  # neither was retried
