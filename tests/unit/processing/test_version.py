"""Code versions: what a day's rows were built with. They are compared with versions
recorded earlier (``status`` shows days built by other code), so a change of how the
settings are modelled must not change them."""

from __future__ import annotations

from eventpipe.config import parse_config
from eventpipe.processing.batch.version import code_version


def test_versions_stay_what_they_were_when_one_model_held_every_type() -> None:
    """Computed with eventpipe 0.1.0 before each destination type had a settings model
    of its own (one flat model of every type's keys)."""
    config = parse_config({"destinations": {
        "w": {"type": "duckdb"},
        "pg": {"type": "postgres", "dsn": "postgresql://x@h/db", "primary_key": ["id"]},
        "lake": {"type": "parquet", "partition_by": "none"},
        "api": {"type": "http", "url": "https://a.example/e", "group_by": ["host"],
                "format": "ndjson"},
    }}, source="t", env={})  # fmt: skip
    assert {d: code_version(config, d) for d in config.destinations} == {
        "w": "e26d1c90c036", "pg": "18bb23983b40", "lake": "f995a815860d", "api": "ebf3a7fd1c6b",
    }  # fmt: skip


def test_a_setting_that_shapes_the_rows_changes_the_version() -> None:
    def version(**settings: object) -> str:
        config = parse_config({"destinations": {"w": {"type": "duckdb", **settings}}},
                              source="t", env={})  # fmt: skip
        return code_version(config, "w")

    assert version() != version(primary_key=["id"])
    assert version() != version(max_columns=10)
    assert version() == version(stream_interval_seconds=5)  # when, not what
