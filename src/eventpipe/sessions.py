"""What eventpipe asks of a Spark session beyond the DataFrame API, answered for both
kinds: a classic session (this process runs the driver, its JVM at hand) and a Spark
Connect one (``spark.remote: sc://...``: the driver is a server, this process a client).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (no JVM, no SparkContext here)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def parallelism(spark: SparkSession) -> int:
    """The cluster's default parallelism (its executors' cores, in local mode the
    threads): how many tasks keep every core busy.

    A Connect client has no SparkContext to ask; ``spark.range`` is split into that
    many partitions by the server, which a small job counts."""
    if not is_connect(spark):
        return max(1, spark.sparkContext.defaultParallelism)
    from pyspark.sql import functions as F

    ids = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p")).distinct()
    return max(1, ids.count())
