"""User functions for the python transform tests (``tests.transform_functions:<name>``)."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc


def keep_even(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Drops the events whose n is odd (Arrow in, Arrow out)."""
    return batch.filter(pc.equal(pc.bit_wise_and(batch.column("n"), 1), 0))


def with_region(frame: pd.DataFrame) -> pd.DataFrame:
    """Adds a column and changes one (pandas in, pandas out)."""
    frame["region"] = frame["country"].map({"de": "eu", "fr": "eu", "us": "na"})
    frame["country"] = frame["country"].str.upper()
    return frame


def fails_on_boom(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Raises when a batch holds an event with boom set."""
    if "boom" in batch.schema.names and pc.any(pc.is_valid(batch.column("boom"))).as_py():
        raise ValueError("boom in this batch")
    return batch


def returns_nothing_usable(batch: pa.RecordBatch) -> list[int]:
    """Returns what is not a batch."""
    return [batch.num_rows]
