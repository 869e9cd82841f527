"""Transform steps on small frames."""

from __future__ import annotations

from typing import Any

from eventpipe.processing.steps import transforms


def test_set_makes_the_objects_an_event_lacks_on_the_way(spark: Any) -> None:
    """``set: {p.b: ...}`` reaches every event: one whose ``p`` is null in the batch gets
    one, one whose ``p`` is a scalar gets an object instead, the others keep their own
    fields beside the new one."""
    lines = ['{"n": 1, "p": {"a": 1}}', '{"n": 2, "x": 2}']
    frame = spark.read.json(spark.sparkContext.parallelize(lines))
    out = transforms._assign(frame, {"p.b": "n * 10", "x.y.z": "'deep'"}, "w")
    rows = sorted((r.asDict(recursive=True) for r in out.collect()), key=lambda r: r["n"])
    assert rows == [
        {"n": 1, "p": {"a": 1, "b": 10}, "x": {"y": {"z": "deep"}}},
        {"n": 2, "p": {"a": None, "b": 20}, "x": {"y": {"z": "deep"}}},
    ]
