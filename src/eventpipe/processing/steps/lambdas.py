"""Spark's higher-order functions (``transform``, ``exists``, ``filter``) with lambda
variables named by the caller, not by Spark's global counter.

PySpark names each lambda variable it makes afresh (``x_7``, then ``x_13`` in the next
plan built), and Spark 4 writes that name into the Java code it generates for the plan.
Its cache of compiled code is keyed by that text, so a plan built again for each run
(every micro-batch of a stream, every small ``process --once``) compiled its code again:
two classes in every run of a ``table_name_template`` with placeholders (Spark's
CodegenMetrics). With names that depend only on the plan's shape, a run of the same
shape finds its code compiled (``tests/unit/processing/test_lambdas.py`` counts the
compilations). The runs' time did not change measurably on a 2-core machine
(docs/pipeline.md).

A caller names its variables so that a lambda nested in another's body never reuses an
enclosing one's name (it would hide it). Under Spark Connect the plan is built by the
client library and PySpark's own functions are used (fresh names, as before).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

if TYPE_CHECKING:
    from pyspark.sql import Column

Body = Callable[["Column"], "Column"]

_PREFIX = "_eventpipe_"
"""Before each caller's name: no event's column or function can be named so."""


def transform(column: Column, body: Body, name: str) -> Column:
    """``F.transform(column, body)`` with its variable named ``name``."""
    return _higher_order("transform", column, body, name, F.transform)


def exists(column: Column, body: Body, name: str) -> Column:
    """``F.exists(column, body)`` with its variable named ``name``."""
    return _higher_order("exists", column, body, name, F.exists)


def keep(column: Column, body: Body, name: str) -> Column:
    """``F.filter(column, body)`` with its variable named ``name``."""
    return _higher_order("filter", column, body, name, F.filter)


def _higher_order(
    function: str,
    column: Column,
    body: Body,
    name: str,
    fresh: Callable[[Column, Body], Column],
) -> Column:
    if type(column).__module__.startswith("pyspark.sql.connect"):
        return fresh(column, body)  # a Connect client's column
    from pyspark import SparkContext
    from pyspark.sql.classic.column import _to_java_column, _to_seq
    from pyspark.sql.column import Column

    context = SparkContext._active_spark_context
    assert context is not None
    assert context._jvm is not None
    # Each class by its full name: one round trip to the JVM, where ``jvm.org.apache...``
    # makes one per part of the name (seven for CurrentOrigin).
    jvm = context._jvm
    # The column node's own constructor: its companion's apply draws a fresh name.
    origin = getattr(jvm, "org.apache.spark.sql.catalyst.trees.CurrentOrigin").get()
    node = getattr(jvm, "org.apache.spark.sql.internal.UnresolvedNamedLambdaVariable")
    variable = node(_PREFIX + name, origin)
    argument = Column(getattr(jvm, "org.apache.spark.sql.Column")(variable))
    result = body(argument)
    utils = getattr(jvm, "org.apache.spark.sql.api.python.PythonSQLUtils")
    function_of = utils.lambdaFunction(result._jc, _to_seq(context, [argument._jc]))
    arguments = [_to_java_column(column), function_of]
    return Column(utils.fn(function, _to_seq(context, arguments)))
