"""``eventpipe status --watch``: redrawn while the pipeline loads, it shows the events/s
of each destination with their recent history, the backlog, and the lag of the oldest
waiting event."""

from __future__ import annotations

import re
import subprocess
from typing import Any

from eventpipe.processing.batch.job import process_once
from tests.e2e.test_batch_pipeline import _post, _seal
from tests.process import EVENTPIPE, _env, write_config


def test_the_watch_shows_the_load_as_it_happens(
    start_collector: Any, spark: Any, tmp_path: Any
) -> None:
    c = start_collector()
    _post(c, [{"event_id": f"e{n}", "n": n} for n in range(500)], server=True)
    _seal(c)
    config = write_config(tmp_path / "eventpipe.yaml", c.layout.root, 0)
    watch = subprocess.Popen([*EVENTPIPE, "status", "--watch", "--interval", "0.5",
                              "--count", "40", "-c", str(config)],
                             stdout=subprocess.PIPE, text=True, env=_env())  # fmt: skip
    assert watch.stdout is not None
    # Its first draw before the run: a small run can end before the command has started.
    first = ""
    while (line := watch.stdout.readline()) and not line.startswith("warehouse "):
        first += line
    first += line
    try:
        process_once(c.config, spark)
    finally:
        rest, _ = watch.communicate(timeout=60)
    output = first + rest
    draws = output.split("eventpipe status --watch, ")[1:]
    assert len(draws) == 40
    assert "1 segment(s)" in draws[0]  # waiting, with its lag in seconds
    assert re.search(r"warehouse\s+\|\s+0\s+\|\s+▁\s+\|\s+1 segment\(s\), [\d.]+ MB\s+\|\s+\d+ s",
                     draws[0])  # fmt: skip
    rates = [int(m.group(1).replace(",", "")) for d in draws
             if (m := re.search(r"warehouse\s+\|\s+([\d,]+)\s+\|", d))]  # fmt: skip
    assert max(rates) > 0  # the load, seen as it happened
    assert re.search(r"\|\s+0 segment\(s\), 0.0 MB\s+\|\s+-\s+\|", draws[-1])  # caught up
    assert "█" in draws[-1]  # the load's peak, in the last minute's line
