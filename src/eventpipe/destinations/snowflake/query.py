"""What ``eventpipe query`` sends to Snowflake or BigQuery: one statement that reads."""

from __future__ import annotations

from eventpipe.errors import QueryError, first_line

_READS = ("SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN")


def check_query(sql: str, dialect: str = "snowflake") -> None:
    """QueryError unless ``sql`` is one statement that reads: parsed with sqlglot's
    ``dialect`` (``snowflake``, ``bigquery``: a well-kept SQL parser, not a guess from
    the text), a SELECT, a set of them, or SHOW/DESCRIBE/EXPLAIN; no ``SYSTEM$`` function
    (some act on a Snowflake account: cancelling queries, say). An identity that can
    only read (``query_role``, ``query_credentials_file``) is the boundary that holds
    whatever the text says."""
    import sqlglot
    from sqlglot import exp

    try:
        statements = [s for s in sqlglot.parse(sql, read=dialect) if s is not None]
    except sqlglot.errors.ParseError as exc:
        raise QueryError(f"not a statement {dialect} reads: {first_line(exc)}") from None
    if len(statements) != 1:
        raise QueryError("one statement at a time")
    [statement] = statements
    reads = isinstance(statement, (exp.Query, exp.Describe)) or (
        isinstance(statement, exp.Command) and str(statement.this).upper() in _READS
    )
    if not reads or any(
        isinstance(
            node,
            (
                exp.Insert,
                exp.Update,
                exp.Delete,
                exp.Merge,
                exp.Create,
                exp.Drop,
                exp.Transaction,
                exp.Commit,
            ),
        )
        for node in statement.walk()
    ):
        raise QueryError("eventpipe query only reads: SELECT, SHOW, DESCRIBE or EXPLAIN")
    if "SYSTEM$" in sql.upper():
        raise QueryError("eventpipe query does not call SYSTEM$ functions")
