"""The type lattice, exhaustively: every pair, both orders, and the properties it must have."""

from __future__ import annotations

import itertools

import pytest

from eventpipe.schema.types import DataType, fits, is_timestamp, json_type, promote, promote_all

B, N, F, T, S = DataType.BOOL, DataType.INT64, DataType.FLOAT64, DataType.TIMESTAMP, DataType.STRING
H = DataType.INT128

# The whole table, written out by hand from seed 1's tree and INT128 (not computed).
EXPECTED = {
    (B, B): B, (B, N): N, (B, H): H, (B, F): F, (B, T): S, (B, S): S,
    (N, N): N, (N, H): H, (N, F): F, (N, T): S, (N, S): S,
    (H, H): H, (H, F): S, (H, T): S, (H, S): S,
    (F, F): F, (F, T): S, (F, S): S,
    (T, T): T, (T, S): S,
    (S, S): S,
}  # fmt: skip


@pytest.mark.parametrize(("a", "b"), list(itertools.product(DataType, repeat=2)))
def test_every_pair_promotes_as_seed_1_says(a: DataType, b: DataType) -> None:
    expected = EXPECTED.get((a, b)) or EXPECTED[(b, a)]
    assert promote(a, b) is expected
    assert promote(b, a) is expected  # commutative


@pytest.mark.parametrize("a", list(DataType))
def test_null_is_the_identity(a: DataType) -> None:
    assert promote(a, None) is a
    assert promote(None, a) is a
    assert promote(None, None) is None


@pytest.mark.parametrize(("a", "b", "c"), list(itertools.product(DataType, repeat=3)))
def test_promotion_is_associative_and_never_narrows(a: DataType, b: DataType, c: DataType) -> None:
    assert promote(promote(a, b), c) is promote(a, promote(b, c))
    result = promote_all([a, b, c])
    assert result is not None
    assert all(fits(t, result) for t in (a, b, c))


@pytest.mark.parametrize(
    ("value_type", "column_type", "expected"),
    [(B, N, True), (N, F, True), (B, S, True), (T, S, True), (F, F, True),
     (N, B, False), (F, N, False), (T, F, False), (S, T, False), (B, T, False), (T, N, False),
     (N, H, True), (B, H, True), (H, S, True), (H, N, False), (H, F, False), (F, H, False)],
)  # fmt: skip
def test_fits_is_the_order_of_the_tree(
    value_type: DataType, column_type: DataType, expected: bool
) -> None:
    assert fits(value_type, column_type) is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, B), (False, B), (0, N), (-5, N), (2**62, N), (2**63 - 1, N), (-(2**63), N),
        (2**63, H), (-(2**63) - 1, H), (10**38 - 1, H), (1.5, F), (1e300, F),
        ("abc", S), ("", S), ("123", S), ("true", S), ([1, 2], S), ([], S), (None, None),
        ("2026-11-21T10:00:00Z", T), ("2026-11-21T10:00:00.123456Z", T),
        ("2026-11-21 10:00:00", T), ("2026-11-21T10:00:00+01:00", T),
        ("2026-11-21T10:00:00-0500", T), ("2026-11-21t10:00:00z", T),
        ("2026-11-21", S), ("2026-13-01T10:00:00Z", S), ("2026-11-21T25:00:00Z", S),
        ("21/11/2026 10:00", S), ("2026-11-21T10:00:00Zjunk", S),
    ],
)  # fmt: skip
def test_json_values_get_their_type(value: object, expected: DataType | None) -> None:
    assert json_type(value) is expected


def test_objects_are_not_leaves() -> None:
    with pytest.raises(TypeError):
        json_type({"a": 1})


def test_is_timestamp_rejects_impossible_times() -> None:
    assert not is_timestamp("2026-00-10T00:00:00Z")
    assert not is_timestamp("2026-01-10T00:61:00Z")
