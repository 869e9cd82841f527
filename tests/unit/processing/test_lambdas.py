"""Higher-order functions with lambda variables named by eventpipe (steps/lambdas.py): the
same values as PySpark's own, and a plan built again for the next run finds its
generated code compiled, where PySpark's fresh names made Spark compile it again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

from eventpipe.processing.steps import lambdas
from eventpipe.processing.steps.template import sanitize_table_name
from eventpipe.schema.naming import table_name


def test_the_functions_give_what_pysparks_own_give(spark: Any) -> None:
    frame = spark.createDataFrame(
        [([1, None, 3], "a/b"), ([], "x"), (None, "")], "a array<int>, t string"
    )
    ours = frame.select(
        lambdas.transform(F.col("a"), lambda x: x * 2, "x").alias("doubled"),
        lambdas.exists(F.col("a"), lambda x: x > 2, "x").alias("big"),
        lambdas.keep(F.col("a"), lambda x: x.isNotNull(), "x").alias("kept"),
        # a lambda in another's body, reading the enclosing one's variable
        lambdas.transform(
            F.col("a"), lambda x: F.size(lambdas.keep(F.col("a"), lambda y: y < x, "y")), "x"
        ).alias("smaller"),
    )  # fmt: skip
    theirs = frame.select(
        F.transform("a", lambda x: x * 2).alias("doubled"),
        F.exists("a", lambda x: x > 2).alias("big"),
        F.filter("a", lambda x: x.isNotNull()).alias("kept"),
        F.transform("a", lambda x: F.size(F.filter("a", lambda y: y < x))).alias("smaller"),
    )
    assert ours.collect() == theirs.collect()
    assert ours.collect()[0]["smaller"] == [0, 0, 1]  # null < 1 keeps nothing


def _compilations(spark: Any) -> int:
    metrics = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics
    return int(metrics.METRIC_COMPILATION_TIME().getCount())


def _run(spark: Any, named: Callable[[Column], Column]) -> list[Any]:
    """A plan built afresh (as each run builds its own) over the same kind of rows."""
    frame = spark.createDataFrame([("Page View",), ("1st-event",), ("select",)], "t string")
    return frame.select(named(F.col("t")).alias("name"), F.col("t")).collect()


def test_a_plan_built_again_compiles_no_new_code(spark: Any) -> None:
    """sanitize_table_name binds each step's value with a lambda: a run's plan built again
    compiles nothing; the same plan with PySpark's transform compiles again each time."""
    first = _run(spark, sanitize_table_name)
    assert [r["name"] for r in first] == [table_name(r["t"]) for r in first]
    before = _compilations(spark)
    assert _run(spark, sanitize_table_name) == first
    assert _compilations(spark) == before

    def fresh(text: Column) -> Column:
        return F.transform(F.array(F.lower(text)), lambda x: F.concat(x, x))[0]

    _run(spark, fresh)
    before = _compilations(spark)
    _run(spark, fresh)
    assert _compilations(spark) > before, "PySpark's fresh names compile again"
