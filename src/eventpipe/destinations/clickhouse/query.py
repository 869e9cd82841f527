"""What ``eventpipe query`` may read on a ClickHouse destination.

The server is the fence that holds: ``readonly=1`` (or ``query_user``, a user in a
``readonly`` profile) refuses writes and setting changes. In front of it, a check of the
text refuses what reads past the destination's tables: table functions that read files,
URLs, other servers or programs, and system tables that hold other sessions' queries or
users. String literals and comments are taken out first, so text that only names them
passes.
"""

from __future__ import annotations

import re

from eventpipe.errors import QueryError

_REFUSED_FUNCTIONS = re.compile(
    r"\b(url|urlCluster|file|fileCluster|remote|remoteSecure|cluster|clusterAllReplicas|s3|"
    r"s3Cluster|gcs|azureBlobStorage|hdfs|hdfsCluster|mysql|postgresql|mongodb|redis|sqlite|"
    r"jdbc|odbc|executable|input|deltaLake|iceberg|hudi|dictionary|generateRandom)\s*\(",
    re.IGNORECASE,
)
_SECRET_TABLES = re.compile(
    r"\bsystem\s*\.\s*`?(processes|query_log|query_thread_log|text_log|users|grants|"
    r"settings_profile_elements|named_collections|zookeeper)\b",
    re.IGNORECASE,
)
_LITERALS = re.compile(r"'(?:[^'\\]|\\.)*'|--[^\n]*|/\*.*?\*/", re.DOTALL)


def check_query(sql: str) -> None:
    """QueryError for a query that reaches past the destination's tables: a table
    function that reads files, URLs, other servers or programs, or a system table that
    holds other sessions' queries or users. ``readonly=1`` (and ``query_user``, a user in
    a read-only profile) keeps it from writing; this keeps it from reading out."""
    bare = _LITERALS.sub("''", sql)
    if (found := _REFUSED_FUNCTIONS.search(bare)) is not None:
        raise QueryError(f"{found.group(1)}(): reaches outside the destination's tables")
    if (found := _SECRET_TABLES.search(bare)) is not None:
        raise QueryError(f"system.{found.group(1)}: holds other sessions' queries or users")
