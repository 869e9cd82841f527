"""Seed 5's semantics written out in plain SQL in DuckDB, independently of eventpipe's
Spark code: the expected output the metering tests compare eventpipe's rows with."""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from eventpipe.processing.steps.metering import Product


def load_products(db: duckdb.DuckDBPyConnection, products: Sequence[Product]) -> None:
    """The catalogue as plain tables: products, filters, allowed and refused values."""
    db.execute("CREATE TABLE products (product_uid TEXT, event_name TEXT)")
    db.execute("CREATE TABLE filters (product_uid TEXT, path TEXT, optional BOOLEAN)")
    db.execute("CREATE TABLE allowed (product_uid TEXT, path TEXT, value TEXT)")
    db.execute("CREATE TABLE refused (product_uid TEXT, path TEXT, value TEXT)")
    for p in products:
        db.execute("INSERT INTO products VALUES (?, ?)", [p.uid, p.event_name])
        for f in p.filters:
            db.execute("INSERT INTO filters VALUES (?, ?, ?)", [p.uid, f.path, f.optional])
            for v in f.within:
                db.execute("INSERT INTO allowed VALUES (?, ?, ?)", [p.uid, f.path, v])
            for v in f.not_within:
                db.execute("INSERT INTO refused VALUES (?, ?, ?)", [p.uid, f.path, v])


MATCHES = """
    SELECT e.id, p.product_uid
    FROM {events} e
    JOIN products p ON json_extract_string(e.doc, '$.properties.name') = p.event_name
    WHERE NOT EXISTS (                      -- every filter of the product passes
        SELECT 1 FROM filters f
        WHERE f.product_uid = p.product_uid
          AND NOT CASE
            -- missing (or null): passes only when optional
            WHEN json_extract_string(e.doc, f.path) IS NULL THEN f.optional
            -- present: in _in (when _in has values) and not in not_in
            ELSE (NOT EXISTS (SELECT 1 FROM allowed a
                              WHERE a.product_uid = f.product_uid AND a.path = f.path)
                  OR json_extract_string(e.doc, f.path) IN (
                      SELECT a.value FROM allowed a
                      WHERE a.product_uid = f.product_uid AND a.path = f.path))
                 AND json_extract_string(e.doc, f.path) NOT IN (
                      SELECT r.value FROM refused r
                      WHERE r.product_uid = f.product_uid AND r.path = f.path)
          END)
"""
"""(event id, product) of every match; ``{events}``: a table of (id, doc JSON)."""

NEWEST = """
    SELECT * EXCLUDE rank FROM (
        SELECT raw.*, ROW_NUMBER() OVER (
            PARTITION BY json_extract_string(raw.doc, '$.transaction_id')
            ORDER BY CAST(json_extract_string(raw.doc, '$.received_at') AS TIMESTAMP) DESC,
                     raw.id DESC
        ) AS rank
        FROM raw
        WHERE CAST(json_extract_string(raw.doc, '$.metered_at') AS TIMESTAMP) >= ?
    ) WHERE rank = 1
    UNION ALL              -- older than the window: compared with nothing, all kept
    SELECT * FROM raw
    WHERE CAST(json_extract_string(raw.doc, '$.metered_at') AS TIMESTAMP) < ?
"""
"""Seed 5's dedup over ``raw`` (id: the order of arrival, doc JSON), with its window."""
