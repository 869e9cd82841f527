"""What ``eventpipe query`` may run on a PostgreSQL destination: one read, nothing else.

A read-only transaction alone is not enough on PostgreSQL: ``COPY ... TO PROGRAM``,
``pg_read_file``, ``pg_terminate_backend`` and reads of ``pg_shadow`` all run inside one
(for a user with the rights). So a query passes three fences, each enough for what it
covers:

1. **Parsed before it is sent** by PostgreSQL's own parser (pglast, libpg_query: the
   server's grammar, not a regular expression). Exactly one statement, of the kinds
   :data:`QUERY_STATEMENTS` (SELECT, VALUES, TABLE, ``WITH`` around a SELECT, EXPLAIN
   of one, SHOW); nowhere inside it a write (a data-modifying ``WITH``), ``SELECT
   INTO``, a row lock (``FOR UPDATE``), a call of a function that reaches files,
   programs, other sessions, settings or runs SQL text of its own
   (:func:`refused_function`), or a read of a catalog that holds secrets or other
   sessions' queries (:data:`SECRET_RELATIONS`).
2. **Run in a transaction that cannot write**: ``READ ONLY``, with
   ``statement_timeout`` and ``lock_timeout`` (``query_timeout_seconds``), so that a
   query never holds a lock that a load waits for beyond that time.
3. **As a user that cannot**: ``query_dsn`` connects with another user, the one to give
   only ``SELECT`` on the schema (docs/destinations.md). The parse is the floor for
   those who leave it out; a role without the rights is the fence that a function this
   module does not know of cannot cross.
"""

from __future__ import annotations

from typing import Any

from eventpipe.errors import QueryError

QUERY_STATEMENTS = ("SelectStmt", "ExplainStmt", "VariableShowStmt")
"""The statements ``eventpipe query`` admits (pglast's node names)."""

WRITES = frozenset({"InsertStmt", "UpdateStmt", "DeleteStmt", "MergeStmt", "IntoClause"})
"""Nodes that write, found anywhere in the tree (``WITH d AS (DELETE ...) SELECT``,
``SELECT ... INTO``)."""

SAFE_PG_FUNCTIONS = frozenset(
    {
        "pg_typeof",
        "pg_column_size",
        "pg_size_pretty",
        "pg_size_bytes",
        "pg_relation_size",
        "pg_total_relation_size",
        "pg_table_size",
        "pg_indexes_size",
        "pg_table_is_visible",
        "pg_get_constraintdef",
        "pg_get_indexdef",
        "pg_get_viewdef",
        "pg_get_expr",
        "pg_encoding_to_char",
        "pg_input_is_valid",
        "pg_input_error_info",
    }
)
"""Functions named ``pg_...`` that read only the catalog of the query's own tables.
Every other ``pg_`` function is refused: files (``pg_read_file``, ``pg_ls_dir``,
``pg_stat_file``), other sessions (``pg_terminate_backend``, ``pg_cancel_backend``,
``pg_stat_get_activity``), the server (``pg_reload_conf``, ``pg_promote``), locks that
a load would wait on (``pg_advisory_lock``), time (``pg_sleep``)."""

REFUSED_PREFIXES = ("pg_", "lo_", "dblink", "binary_upgrade_", "brin_", "gin_")
"""Name prefixes of functions refused (but :data:`SAFE_PG_FUNCTIONS`): large objects
read and write server files (``lo_import``, ``lo_export``), dblink opens connections,
the rest change indexes or the cluster."""

REFUSED_FUNCTIONS = frozenset(
    {
        # SQL text of their own, run inside: a COPY TO PROGRAM there would run too.
        "query_to_xml",
        "query_to_xmlschema",
        "query_to_xml_and_xmlschema",
        "cursor_to_xml",
        "cursor_to_xmlschema",
        "table_to_xml",
        "table_to_xmlschema",
        "table_to_xml_and_xmlschema",
        "schema_to_xml",
        "schema_to_xmlschema",
        "schema_to_xml_and_xmlschema",
        "database_to_xml",
        "database_to_xmlschema",
        "database_to_xml_and_xmlschema",
        "ts_stat",
        "ts_rewrite",
        # settings of the session, sequences (writes).
        "set_config",
        "nextval",
        "setval",
    }
)

SECRET_RELATIONS = frozenset(
    {
        "pg_authid",
        "pg_shadow",
        "pg_user_mapping",
        "pg_user_mappings",
        "pg_largeobject",
        "pg_stat_activity",
        "pg_file_settings",
        "pg_hba_file_rules",
        "pg_ident_file_mappings",
        "pg_config",
        "pg_stat_statements",
        "pg_subscription",
    }
)
"""Catalogs that hold password hashes, other users' credentials, other sessions' query
text, the server's files or settings: never read by ``eventpipe query``."""


def refused_function(name: str) -> bool:
    """Whether a function of this name (any schema, any case) is out of a query's reach."""
    name = name.lower()
    if name in SAFE_PG_FUNCTIONS:
        return False
    return name in REFUSED_FUNCTIONS or name.startswith(REFUSED_PREFIXES)


def check_query(sql: str) -> None:
    """Refuse ``sql`` with a QueryError unless it is one read this module admits (see
    the module's docstring); it is parsed, never run here."""
    from pglast import ast, parse_sql
    from pglast.parser import ParseError

    try:
        statements = parse_sql(sql)
    except ParseError as exc:
        raise QueryError(f"not a PostgreSQL query: {exc}") from None
    if len(statements) != 1:
        raise QueryError(
            f"eventpipe query runs one statement; this is {len(statements) or 'no'} statements"
        )
    statement = statements[0].stmt
    kind = type(statement).__name__
    if kind not in QUERY_STATEMENTS:
        raise QueryError(
            "eventpipe query is read-only: it runs one SELECT, EXPLAIN or SHOW; this is "
            f"{kind.removesuffix('Stmt').upper()}"
        )
    if isinstance(statement, ast.ExplainStmt) and not isinstance(statement.query, ast.SelectStmt):
        inner = type(statement.query).__name__
        raise QueryError(f"eventpipe query explains a SELECT only; this explains {inner}")
    for node in _nodes(statement):
        _check_node(node, ast)


def _check_node(node: Any, ast: Any) -> None:
    kind = type(node).__name__
    if kind in WRITES:
        raise QueryError(f"eventpipe query is read-only: the query holds {kind}")
    if isinstance(node, ast.SelectStmt) and node.lockingClause:
        raise QueryError("eventpipe query takes no row locks (FOR UPDATE, FOR SHARE)")
    if isinstance(node, ast.FuncCall):
        name = node.funcname[-1].sval
        if refused_function(name):
            raise QueryError(
                f"eventpipe query does not call {name}(): it reaches beyond the tables "
                "(files, programs, other sessions, settings or SQL of its own)"
            )
    if isinstance(node, ast.RangeVar) and node.relname.lower() in SECRET_RELATIONS:
        raise QueryError(f"eventpipe query does not read {node.relname}")


def _nodes(root: Any) -> Any:
    """Every node of a pglast tree, ``root`` included, depth first."""
    from pglast import ast

    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, tuple | list):
            stack.extend(node)
            continue
        if not isinstance(node, ast.Node):
            continue
        yield node
        for slot in node:  # iterating a pglast node gives its attribute names
            stack.append(getattr(node, slot))
