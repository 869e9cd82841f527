"""Column names from hostile keys: every rule of eventpipe.schema.naming."""

from __future__ import annotations

import re

import pytest

from eventpipe.schema.naming import (
    MAX_NAME_LENGTH,
    column_name,
    sanitize_key,
    table_name,
    winner,
)

VALID = re.compile(r"^[a-z_][a-z0-9_]*$")


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("event_type", "event_type"),
        ("Page URL", "page_url"),
        ("x; DROP TABLE y", "x__drop_table_y"),
        ("", "_unnamed"),
        ("1a", "_1a"),
        ("select", "select"),
        ("ORDER", "order"),
        ("camelCase", "camelcase"),
        ("a.b", "a_b"),
        ("名前_id", "___id"),
        ("über", "_ber"),
    ],
)
def test_keys(key: str, expected: str) -> None:
    assert column_name([key]) == expected


@pytest.mark.parametrize("key", ["?!", "名前", "年齢", "🙂", "__", " "])
def test_keys_with_no_letter_or_digit_get_a_stable_distinct_name(key: str) -> None:
    name = column_name([key])
    assert re.fullmatch(r"_k[0-9a-f]{8}", name)
    assert column_name([key]) == name  # the same in every batch


def test_distinct_symbol_keys_stay_distinct() -> None:
    names = {column_name([k]) for k in ["?!", "!?", "名前", "年齢", "🙂", "__", " ", "?"]}
    assert len(names) == 8


def test_paths_are_joined_with_underscores() -> None:
    assert column_name(["user", "Address", "ZIP code"]) == "user_address_zip_code"
    assert column_name(["eventn_ctx", "event_id"]) == "eventn_ctx_event_id"
    assert column_name(["", "x"]) == "_unnamed_x"


def test_long_names_are_cut_with_a_hash_and_stay_distinct() -> None:
    a = column_name(["a" * 100])
    b = column_name(["a" * 99 + "b"])
    assert len(a) == len(b) == MAX_NAME_LENGTH
    assert a != b
    assert a.startswith("a" * 54 + "_")
    assert column_name(["a" * 63]) == "a" * 63  # at the limit: unchanged


def test_two_thousand_distinct_keys_give_two_thousand_valid_names() -> None:
    keys = [f"Key {i}" for i in range(1000)] + [f"k{'x' * 70}{i}" for i in range(1000)]
    names = [column_name([k]) for k in keys]
    assert len(set(names)) == 2000
    assert all(VALID.match(n) and len(n) <= MAX_NAME_LENGTH for n in names)


@pytest.mark.parametrize("key", ["?!", "名前", "x; DROP TABLE y", "", "1a", "a" * 100, "select"])
def test_every_name_is_a_plain_identifier(key: str) -> None:
    assert VALID.match(column_name([key]))


def test_collisions_are_won_by_the_shortest_then_smallest_path() -> None:
    assert winner([("a", "b"), ("a_b",)]) == ("a_b",)
    assert winner([("a",), ("A",)]) == ("A",)  # "A" < "a" in code points
    assert winner([("a",), ("A",), ("a ",)]) == ("A",)
    # the order the paths are seen in does not matter
    assert winner([("a_b",), ("a", "b")]) == winner([("a", "b"), ("a_b",)])


def test_table_names() -> None:
    assert table_name("page_view") == "page_view"
    assert table_name("Page View 2026_11") == "page_view_2026_11"
    assert table_name("") == ""
    assert table_name("2026") == "_2026"


def test_sanitize_key_is_idempotent_on_its_output() -> None:
    for key in ["Page URL", "x; DROP", "a.b"]:
        once = sanitize_key(key)
        assert sanitize_key(once) == once
