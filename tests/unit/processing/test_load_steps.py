"""The load stage's decisions, on the fake destination (tests/fakes.py): which columns a
table takes within max_columns, and how a refused load is split down to its poison
events, resumably."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eventpipe.destinations.base import LoadRequest
from eventpipe.processing.batch import load
from eventpipe.processing.batch.load import Parts, PoisonLimitError, split_load
from eventpipe.processing.batch.shape import within_max_columns
from eventpipe.reserved import ROW
from eventpipe.schema.diff import Table
from eventpipe.schema.naming import UNMAPPED_COLUMN
from eventpipe.schema.types import DataType
from tests.fakes import MemoryDestination

S, N = DataType.STRING, DataType.INT64


def test_a_table_within_max_columns_takes_every_column() -> None:
    wanted = {"a": S, "b": N}
    assert within_max_columns(wanted, None, 10, {}) == (wanted, [])


def test_new_columns_past_max_columns_overflow_by_name_explicit_first() -> None:
    existing = Table("t", {"a": S, "b": S})
    wanted = {"a": S, "z": N, "c": N, "m": S, "x": S}
    # 5 columns at most: a, b stay; one place for _unmapped_data; two new ones fit.
    kept, overflow = within_max_columns(wanted, existing, 5, explicit={"x": S})
    assert overflow == ["m", "z"]  # x first (explicitly typed), then c by name
    assert kept == {"a": S, "c": N, "x": S}


def test_a_table_full_already_sends_every_new_column_to_unmapped_data() -> None:
    existing = Table("t", {"a": S, "b": S, UNMAPPED_COLUMN: S})
    kept, overflow = within_max_columns({"a": S, "new": N}, existing, 3, {})
    assert (kept, overflow) == ({"a": S}, ["new"])


def _batch(tmp_path: Path, values: list[str]) -> LoadRequest:
    path = tmp_path / "staged.parquet"
    rows = pa.table({ROW: list(range(100, 100 + len(values))), "v": values})
    pq.write_table(rows, path)
    return LoadRequest("t", "run-1:t", (path,), {ROW: N, "v": S})


def _refuses_bad(row: dict[str, object]) -> str | None:
    return f"bad value {row['v']}" if str(row["v"]).startswith("bad") else None


def test_a_refused_load_is_split_down_to_its_poison_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(load, "PART_ROWS", 8)
    values = [f"ok{i}" for i in range(20)]
    values[3], values[17] = "bad3", "bad17"
    dest = MemoryDestination(refuses=_refuses_bad)
    split = split_load(Parts(tmp_path / "parts"), _batch(tmp_path, values), dest, 10, "refused")
    assert sorted(split.poison) == [(103, "refused: bad value bad3"),
                                    (117, "refused: bad value bad17")]  # fmt: skip
    assert split.loaded == 18
    assert sorted(r["v"] for r in dest.rows["t"]) == sorted(v for v in values if v[:3] != "bad")
    # Parts of 8, 8 and 4 rows: 3 loads. The refused part of 8 is halved down to its
    # event (two halves of 4, of 2, of 1: 6 loads); the refused part of 4, in 4 loads.
    assert split.loads == dest.loads == 3 + 6 + 4
    # Run again (a resumed run): every part is known loaded, no row twice.
    again = split_load(Parts(tmp_path / "parts"), _batch(tmp_path, values), dest, 10, "x")
    assert again.loaded == 0
    assert len(dest.rows["t"]) == 18


def test_more_poison_events_than_allowed_stop_the_destination(tmp_path: Path) -> None:
    values = ["bad"] * 5
    dest = MemoryDestination(refuses=_refuses_bad)
    with pytest.raises(PoisonLimitError, match="more than 3 events of one batch refused"):
        split_load(Parts(tmp_path / "parts"), _batch(tmp_path, values), dest, 3, "refused")
