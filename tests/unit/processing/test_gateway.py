"""The driver's JVM view remembers the classes and static methods PySpark's column API
looks up (runtime/gateway.py): after the first use, building columns and passing lists
of them makes no reflection round trip to the JVM, and the columns are the same."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import functions as F

from eventpipe.processing.runtime.gateway import remember_lookups


@pytest.fixture
def commands(spark: Any) -> Iterator[list[str]]:
    """The Py4J commands the driver sends while the test runs (their first two lines)."""
    client = spark.sparkContext._gateway._gateway_client
    sent: list[str] = []
    send = client.send_command

    def counting(command: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(" ".join(command.split("\n")[:3]))
        return send(command, *args, **kwargs)

    client.send_command = counting
    yield sent
    del client.send_command  # the class's method again


def _columns(spark: Any) -> Any:
    frame = spark.range(3).withColumns({"twice": F.col("id") * F.lit(2)})
    return frame.select(F.when(F.col("id") > F.lit(0), F.col("twice")).alias("x"), "id")


def test_columns_are_built_without_looking_their_functions_up_again(
    spark: Any, commands: list[str]
) -> None:
    assert remember_lookups(spark)  # the session's start did it: nothing more to do
    _columns(spark)
    commands.clear()
    frame = _columns(spark)
    assert [c for c in commands if c.startswith("r ")] == []
    assert sum(c.startswith("c ") for c in commands) > 5  # the calls themselves were made
    assert [tuple(r) for r in frame.orderBy("id").collect()] == [(None, 0), (2, 1), (4, 2)]


def test_without_it_every_column_looks_its_function_up(spark: Any, commands: list[str]) -> None:
    """What the remembering saves (and that the test above would see it missing): a
    JVM view that has forgotten looks the class and the method up for every column."""
    view = spark.sparkContext._jvm
    remembered = {name: vars(view).pop(name) for name in ("org.apache.spark.sql.functions",)}
    try:
        F.col("id")
        F.col("id")
        lookups = [c for c in commands if c.startswith("r ")]
        assert len(lookups) == 4, lookups  # the class, then the method, each time
    finally:
        vars(view).update(remembered)
