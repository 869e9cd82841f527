"""Mapping casts name lattice types by their own names or SQL aliases."""

from __future__ import annotations

import pytest

from eventpipe.errors import ConfigError
from eventpipe.schema.types import DataType, parse_type


@pytest.mark.parametrize(
    ("text", "expected"),
    [("INT64", DataType.INT64), ("bigint", DataType.INT64), ("varchar(255)", DataType.STRING),
     ("numeric(38,18)", DataType.FLOAT64), ("decimal", DataType.FLOAT64),
     ("INT128", DataType.INT128), ("hugeint", DataType.INT128),
     ("numeric(38,0)", DataType.INT128), ("DECIMAL( 20 , 0 )", DataType.INT128),
     ("timestamptz", DataType.TIMESTAMP), ("Boolean", DataType.BOOL)],
)  # fmt: skip
def test_types_and_aliases(text: str, expected: DataType) -> None:
    assert parse_type(text) is expected


def test_an_unknown_type_lists_the_lattice() -> None:
    with pytest.raises(ConfigError, match=r"unknown type 'money'.*INT128"):
        parse_type("money", where="mapping[0].type")
