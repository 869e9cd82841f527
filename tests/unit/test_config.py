"""Config: typed, frozen, unknown keys and wrong types rejected with their full path."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from eventpipe.config import (
    Config,
    iter_fields,
    load_config,
    parse_config,
    with_dev_keys,
)
from eventpipe.errors import ConfigError


def _error(data: object, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, source="eventpipe.yaml", env=env or {})
    return info.value.message


def test_defaults_match_the_contract() -> None:
    config = Config()
    assert config.data_dir == Path("data")
    assert config.server.host == "127.0.0.1"
    assert config.server.port == 8001
    assert config.server.max_body_bytes == 1_000_000
    assert config.server.max_event_bytes == 51_200
    assert config.incoming.rotate_seconds == 300
    assert config.incoming.max_segment_bytes == 100_000_000
    assert config.api_keys == ()


def test_unknown_key_is_named_by_its_path_with_a_hint() -> None:
    message = _error({"server": {"prot": 9000}})
    assert "server.prot: unknown key (did you mean 'port'?)" in message


def test_unknown_key_in_a_list_item_has_its_index() -> None:
    message = _error({"api_keys": [{"id": "web", "js": "secret-123", "origin": ["x"]}]})
    assert "api_keys[0].origin: unknown key (did you mean 'origins'?)" in message


def test_wrong_type_says_what_was_expected_and_what_came() -> None:
    message = _error({"server": {"port": "eighty"}})
    assert re.search(r"server\.port: expected a valid integer.*got 'eighty'", message)


def test_wrong_literal_lists_the_choices() -> None:
    message = _error({"logging": {"format": "xml"}})
    assert "logging.format: expected 'text' or 'json', got 'xml'" in message


def test_every_problem_is_reported_at_once() -> None:
    message = _error({"server": {"port": -1, "hots": "x"}, "incoming": {"fsync": "maybe"}})
    assert "server.port" in message
    assert "server.hots" in message
    assert "incoming.fsync" in message


def test_models_are_frozen() -> None:
    config = Config()
    with pytest.raises(ValidationError):
        config.server.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    "key_id", ["../etc", "a/b", "a.b", "", "x" * 65, "a=b", "a|b", "-lead", "wé"]
)
def test_unsafe_key_ids_are_rejected_at_load(key_id: str) -> None:
    message = _error({"api_keys": [{"id": key_id, "js": "secret-123"}]})
    assert "api_keys[0].id" in message
    assert "not a safe id" in message


def test_a_key_needs_a_secret_and_secrets_must_be_distinct() -> None:
    assert "needs a 'js' secret" in _error({"api_keys": [{"id": "a"}]})
    duplicate = _error(
        {"api_keys": [{"id": "a", "js": "secret-123"}, {"id": "b", "server": "secret-123"}]}
    )
    assert "reuses a secret" in duplicate
    assert "used twice" in _error(
        {"api_keys": [{"id": "a", "js": "secret-123"}, {"id": "a", "js": "secret-456"}]}
    )


def test_trusted_proxies_must_be_networks() -> None:
    assert "server.trusted_proxies[0]" in _error({"server": {"trusted_proxies": ["nope"]}})
    config = parse_config({"server": {"trusted_proxies": ["10.0.0.0/8", "::1"]}}, source="t")
    assert config.server.trusted_proxies == ("10.0.0.0/8", "::1")


def test_environment_variables_are_expanded() -> None:
    config = parse_config(
        {"api_keys": [{"id": "web", "js": "${JS_KEY}", "server": "${S_KEY:-fallback-123}"}]},
        source="t",
        env={"JS_KEY": "from-env-123"},
    )
    key = config.api_keys[0]
    assert key.js is not None
    assert key.js.get_secret_value() == "from-env-123"
    assert key.server is not None
    assert key.server.get_secret_value() == "fallback-123"
    assert "from-env-123" not in repr(config)  # secrets never show in reprs or logs


def test_a_missing_environment_variable_names_the_key() -> None:
    message = _error({"api_keys": [{"id": "web", "js": "${NOPE}"}]})
    assert message == "api_keys[0].js: environment variable NOPE is not set"


def test_no_file_means_embedded_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    loaded = load_config()
    assert loaded.embedded
    assert loaded.source == "built-in defaults"


def test_an_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_invalid_yaml_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "eventpipe.yaml"
    path.write_text("server: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_a_key_given_twice_is_an_error_naming_both_lines(tmp_path: Path) -> None:
    """YAML parsers keep the last of two equal keys: a setting added above the one the
    generated config already has would be silently overridden by it."""
    path = tmp_path / "eventpipe.yaml"
    path.write_text(
        "destinations:\n"
        "  warehouse:\n"
        "    type: duckdb\n"
        "    on_violation: quarantine\n"
        "    mode: batch\n"
        "    on_violation: flag\n"
    )
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    message = str(raised.value)
    assert "'on_violation' is given twice in one mapping (first on line 4)" in message
    assert f'in "{path}", line 6' in message


def test_keys_merged_in_may_be_overridden(tmp_path: Path) -> None:
    path = tmp_path / "eventpipe.yaml"
    path.write_text(
        "destinations:\n"
        "  a: &base\n"
        "    type: duckdb\n"
        "    on_violation: flag\n"
        "  b:\n"
        "    <<: *base\n"
        "    on_violation: quarantine\n"
        "    path: b.duckdb\n"
    )
    destinations = load_config(path).config.destinations
    assert destinations["a"].on_violation == "flag"
    assert destinations["b"].on_violation == "quarantine"


def test_dev_keys_are_generated_once_and_kept(tmp_path: Path) -> None:
    config = Config(data_dir=tmp_path / "data")
    first, key = with_dev_keys(config)
    second, again = with_dev_keys(config)
    assert first.api_keys == second.api_keys == (key,)
    assert key == again
    assert key.js is not None
    assert key.js.get_secret_value().startswith("js.")
    assert (config.layout.dev_keys.stat().st_mode & 0o777) == 0o600


def _reference_text() -> str:
    return resources.files("eventpipe").joinpath("reference.yaml").read_text(encoding="utf-8")


def test_reference_config_loads_and_matches_the_defaults() -> None:
    text = (
        _reference_text()
        .replace("__JS_SECRET__", "js-123456")
        .replace("__SERVER_SECRET__", "s2s-123456")
    )
    config = parse_config(yaml.safe_load(text), source="reference.yaml", env={})
    assert config.model_dump(exclude={"api_keys"}) == Config().model_dump(exclude={"api_keys"})


def test_reference_config_documents_every_field() -> None:
    text = _reference_text()
    for path, field in iter_fields(Config):
        leaf = path.rsplit(".", 1)[-1]
        # Keys of list items may be shown in a commented example: `# - {name: ..., from: ...}`,
        # and keys of an optional block in a commented block: `#   products: ...`.
        shown = rf"^\s*(- )?{leaf}:|^\s*# - \{{.*\b{leaf}:|^\s*#\s+{leaf}: \S"
        assert re.search(shown, text, re.MULTILINE), f"{path} missing"
        assert field.description, f"{path} has no docstring"


def test_spark_settings_pass_through_with_the_spark_prefix() -> None:
    config = parse_config(
        {
            "spark": {
                "master": "spark://10.0.0.1:7077",
                "spark.executor.memory": "4g",
                "sql.shuffle.partitions": 8,
                "spark.sql.adaptive.enabled": False,
            }
        },
        source="t",
    )
    assert config.spark.settings == {
        "spark.master": "spark://10.0.0.1:7077",
        "spark.executor.memory": "4g",
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.adaptive.enabled": "false",
    }
    # Without a master, none is set: spark-submit's --master, or the local default.
    assert (
        "spark.master" not in parse_config({"spark": {"cores.max": 2}}, source="t").spark.settings
    )


def test_spark_settings_must_be_scalars_with_sane_names() -> None:
    assert "expected a string, number or boolean" in _error({"spark": {"x.y": [1]}})
    assert "not a Spark setting name" in _error({"spark": {"bad key": 1}})


def test_spark_connect_takes_what_a_client_can_run() -> None:
    remote = {"remote": "sc://spark.internal:15002"}
    config = parse_config({"spark": remote}, source="t", env={})
    assert config.spark.settings == {"spark.remote": "sc://spark.internal:15002"}
    assert "master and remote exclude each other" in _error(
        {"spark": {**remote, "master": "local[2]"}}
    )
    live = {"live": {"type": "duckdb", "mode": "stream"}}
    assert "'live': mode stream needs a classic Spark session" in _error(
        {"spark": remote, "destinations": live}
    )
    lake = {"lake": {"type": "parquet", "path": "s3a://bucket/lake"}}
    assert "'lake': a parquet path that is a URI" in _error({"spark": remote, "destinations": lake})


def test_a_parquet_path_may_be_a_uri_and_a_duckdb_path_may_not() -> None:
    lake = {"type": "parquet", "path": "s3a://bucket/lake"}
    config = parse_config({"destinations": {"lake": lake}}, source="eventpipe.yaml", env={})
    assert config.destinations["lake"].path == "s3a://bucket/lake"  # not collapsed to s3a:/
    message = _error({"destinations": {"w": {"type": "duckdb", "path": "s3a://b/w.duckdb"}}})
    assert "duckdb takes a local file, not a URI" in message
    message = _error({"destinations": {"lake": {**lake, "primary_key": ["id"]}}})
    assert (
        "primary_key: parquet cannot upsert; duckdb, postgres, clickhouse, iceberg and delta can"
        in message
    )
    message = _error({"destinations": {"lake": {**lake, "mode": "stream"}}})
    assert "destinations.lake: mode stream: parquet takes batch" in message


def test_lakehouse_destinations_take_a_local_path_a_catalog_and_no_metering() -> None:
    from eventpipe.destinations.registry import iceberg_catalog

    lakes = {"ice": {"type": "iceberg"}, "delta": {"type": "delta", "primary_key": ["id"]}}
    config = parse_config({"destinations": lakes, "data_dir": "/srv/ep"}, source="t", env={})
    ice = config.destinations["ice"]
    assert iceberg_catalog(ice, config) == {  # type: ignore[arg-type]
        "type": "sql", "uri": "sqlite:////srv/ep/iceberg_catalog.db"}  # fmt: skip
    assert config.destinations["delta"].primary_key == ("id",)
    shared = {"type": "iceberg", "catalog": {"uri": "postgresql://u:p@db/lake"}}
    config = parse_config({"destinations": {"ice": shared}}, source="t", env={})
    assert iceberg_catalog(config.destinations["ice"], config)["uri"] == (  # type: ignore[arg-type]
        "postgresql+psycopg://u:p@db/lake")  # fmt: skip
    assert "catalog type rest needs uri" in _error(
        {"destinations": {"ice": {"type": "iceberg", "catalog": {"type": "rest"}}}}
    )
    assert "which table formats cannot; meter into a duckdb or postgres" in _error(
        {"destinations": {"d": {"type": "delta", "metering": {"table": "usage"}}}}
    )
    assert "a local directory or s3://bucket/prefix" in _error(
        {"destinations": {"d": {"type": "delta", "path": "abfss://c@acct/lake"}}}
    )
    assert "mode stream: delta takes batch" in _error(
        {"destinations": {"d": {"type": "delta", "mode": "stream"}}}
    )


def test_a_lake_on_s3_takes_its_store_from_s3_keys_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from eventpipe.destinations.registry import _lake_root

    store = {"endpoint": "http://minio.internal:9000", "region": "eu-west-1",
             "access_key_id": "${KEY}", "secret_access_key": "${SECRET}"}  # fmt: skip
    lakes = {
        "delta": {"type": "delta", "path": "s3://bucket/lake/delta", "s3": store},
        "ice": {"type": "iceberg", "path": "s3://bucket/lake/ice/"},
        "files": {"type": "parquet", "path": "s3://bucket/lake/files", "s3": store},
    }
    env = {"KEY": "AKIA-TEST", "SECRET": "hush-1234"}
    config = parse_config({"destinations": lakes}, source="t", env=env)
    assert "hush-1234" not in repr(config)  # never in a log line
    where = _lake_root(config.destinations["delta"], config)  # type: ignore[arg-type]
    assert (where.uri, where.remote) == ("s3://bucket/lake/delta", True)
    assert where.delta_options() == {
        "AWS_ENDPOINT_URL": "http://minio.internal:9000", "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "eu-west-1", "AWS_ACCESS_KEY_ID": "AKIA-TEST",
        "AWS_SECRET_ACCESS_KEY": "hush-1234",
    }  # fmt: skip
    # No s3: keys: the environment's standard AWS variables, read when the lake opens.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://r2.example")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-env")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    ice = _lake_root(config.destinations["ice"], config)  # type: ignore[arg-type]
    assert ice.uri == "s3://bucket/lake/ice"
    assert ice.s3 is not None
    properties = ice.s3.iceberg_properties()
    assert (properties["s3.endpoint"], properties["s3.access-key-id"]) == (
        "https://r2.example", "from-env")  # fmt: skip
    assert "s3: says how an s3:// path is reached" in _error(
        {"destinations": {"d": {"type": "delta", "s3": {"region": "eu-west-1"}}}}
    )
    assert "write s3://bucket or s3://bucket/prefix" in _error(
        {"destinations": {"d": {"type": "parquet", "path": "s3://bucket/../x"}}}
    )
    assert "endpoint 'minio:9000': write http(s)://host:port" in _error(
        {"destinations": {"d": {**lakes["ice"], "s3": {"endpoint": "minio:9000"}}}}
    )
    # Not a Spark path: a Spark Connect client writes it as well.
    spark = {"remote": "sc://spark:15002"}
    remote = parse_config({"spark": spark, "destinations": {"files": lakes["files"]}},
                          source="t", env=env)  # fmt: skip
    assert remote.destinations["files"].path == "s3://bucket/lake/files"


def test_a_source_needs_a_dsn_an_id_of_its_own_and_a_regular_expression() -> None:
    source = {"dsn": "postgresql://u@db/shop", "tables": "^public\\.orders$"}
    config = parse_config({"sources": {"pg": source}}, source="t", env={})
    assert config.source("pg").tables == "^public\\.orders$"
    assert config.source("pg").slot is None  # eventpipe_pg, made by the reader
    keys = [{"id": "pg", "server": "s2s-secret-1"}]
    assert "source 'pg' has the id of an api key" in _error(
        {"api_keys": keys, "sources": {"pg": source}}
    )
    assert "is not a regular expression" in _error({"sources": {"pg": {**source, "tables": "("}}})
    assert "sources.pg.dsn: required key is missing" in _error({"sources": {"pg": {}}})
    assert "sources.pg.slot: slot 'a-b': use letters, digits and _" in _error(
        {"sources": {"pg": {**source, "slot": "a-b"}}}
    )


def test_an_http_sink_needs_a_url_and_takes_either_mode() -> None:
    sink = {"type": "http", "url": "https://api.example/addEvents", "group_by": ["host"]}
    config = parse_config({"destinations": {"api": sink}}, source="eventpipe.yaml", env={})
    assert config.destinations["api"].max_payload_bytes == 6_000_000
    assert "destinations.api.url: required key is missing" in _error(
        {"destinations": {"api": {"type": "http"}}}
    )
    assert "write http:// or https://" in _error(
        {"destinations": {"api": {**sink, "url": "ftp://x"}}}
    )
    streamed = {"destinations": {"api": {**sink, "mode": "stream"}}}
    config = parse_config(streamed, source="eventpipe.yaml", env={})
    assert config.destinations["api"].mode == "stream"
    message = _error({"destinations": {"w": {"type": "duckdb", "url": "x"}}})
    assert "destinations.w.url: unknown key (url is for type clickhouse, http or ga4)" in message


def test_a_database_streams_twice_a_second_and_the_others_once_unless_told() -> None:
    """A database's load is one transaction: its micro-batches start every 0.5 s; the
    others' (a ClickHouse insert, an API's request) every second; either as configured."""
    destinations = {
        "d": {"type": "duckdb", "mode": "stream"},
        "p": {"type": "postgres", "dsn": "postgresql://x@h/db", "mode": "stream"},
        "c": {"type": "clickhouse", "url": "http://127.0.0.1:8123", "mode": "stream"},
        "h": {"type": "http", "url": "https://api.example/in", "mode": "stream"},
        "slow": {"type": "duckdb", "path": "slow.duckdb", "mode": "stream",
                 "stream_interval_seconds": 5},
    }  # fmt: skip
    config = parse_config({"destinations": destinations}, source="eventpipe.yaml", env={})
    intervals = {d: dest.stream_interval_seconds for d, dest in config.destinations.items()}
    assert intervals == {"d": 0.5, "p": 0.5, "c": 1.0, "h": 1.0, "slow": 5.0}
    assert "greater than 0" in _error(
        {"destinations": {"d": {"type": "duckdb", "stream_interval_seconds": 0}}}
    )


def test_each_destination_type_takes_only_its_own_keys_and_the_error_names_the_key() -> None:
    """One settings model per type: a key of another type names the types it is for, a
    misspelt key gets the nearest of its own type's keys, and the path is the user's
    (without the type pydantic adds), even for a destination named like a type."""
    pg = {"type": "postgres", "dsn": "postgresql://db/x"}
    cases = {
        "destinations.postgres.path: unknown key (path is for type duckdb, parquet, iceberg "
        "or delta)":
            {"postgres": {**pg, "path": "/tmp/x"}},
        "destinations.lake.dsn: unknown key (dsn is for type postgres or redshift)":
            {"lake": {"type": "parquet", "dsn": "postgresql://db/x"}},
        "destinations.api.metering: unknown key (metering is for type duckdb or postgres)":
            {"api": {"type": "http", "url": "https://a.example", "metering": {}}},
        "destinations.ch.metering: unknown key (metering is for type duckdb or postgres)":
            {"ch": {"type": "clickhouse", "url": "http://ch:8123", "metering": {}}},
        "destinations.api.primary_key: unknown key (primary_key is for type duckdb, "
        "postgres, clickhouse, snowflake, bigquery, redshift, parquet, iceberg or delta)":
            {"api": {"type": "http", "url": "https://a.example", "primary_key": ["id"]}},
        "destinations.w.partiton_by: unknown key (did you mean 'partition_by'?)":
            {"w": {"type": "parquet", "partiton_by": "day"}},
        "destinations.w.type: required key is missing (duckdb, postgres, clickhouse, "
        "snowflake, bigquery, redshift, parquet, iceberg, delta, http or ga4)":
            {"w": {"path": "x.duckdb"}},
        "destinations.w.type: expected duckdb, postgres, clickhouse, snowflake, bigquery, "
        "redshift, parquet, iceberg, delta, http or ga4, got 'mysql'":
            {"w": {"type": "mysql"}},
        "destinations.w.transforms[0].fliter: unknown key (did you mean 'filter'?)":
            {"w": {"type": "duckdb", "transforms": [{"fliter": "true"}]}},
        "destinations.pg.dsn: required key is missing": {"pg": {"type": "postgres"}},
    }  # fmt: skip
    for expected, destinations in cases.items():
        assert expected in _error({"destinations": destinations}), expected
    metered = {"type": "duckdb", "mode": "stream", "metering": {"products": "p.csv"}}
    assert "metering replaces rows of earlier batches" in _error({"destinations": {"w": metered}})


def test_a_postgres_state_store_needs_a_dsn_and_a_schema_of_its_own() -> None:
    dsn = "postgresql://eventpipe:${PGPASSWORD}@db:5432/analytics"
    state = {"type": "postgres", "dsn": dsn}
    config = parse_config({"state": state}, source="eventpipe.yaml", env={"PGPASSWORD": "pw"})
    assert (config.state.dsn, config.state.db_schema) == (dsn.replace("${PGPASSWORD}", "pw"),
                                                           "eventpipe")  # fmt: skip
    assert "pw" not in repr(config.state)
    assert Config().state.type == "sqlite"
    assert "type postgres needs dsn" in _error({"state": {"type": "postgres"}})
    assert "dsn is for type postgres" in _error({"state": {"dsn": "postgresql://db/x"}})
    assert "use letters, digits" in _error(
        {"state": {**state, "schema": "a;b"}}, {"PGPASSWORD": "p"}
    )
    shared = {
        "state": {**state, "schema": "events"},
        "destinations": {"pg": {"type": "postgres", "dsn": dsn, "schema": "events"}},
    }
    assert "is destination 'pg''s schema too" in _error(shared, env={"PGPASSWORD": "pw"})
    elsewhere = {
        **shared,
        "destinations": {
            "pg": {"type": "postgres", "schema": "events", "dsn": "postgresql://db:5432/other"}
        },
    }
    parse_config(elsewhere, source="eventpipe.yaml", env={"PGPASSWORD": "pw"})  # other database


def test_paths_spark_would_read_as_patterns_are_refused() -> None:
    assert "has [ ] in it, which Spark reads as a pattern" in _error({"data_dir": "/srv/runs[2]"})
    assert "processing.work_dir" in _error({"processing": {"work_dir": "/scratch/*"}})
    assert parse_config({"data_dir": "/srv/events-2 (copy)"}, source="t", env={})


def test_a_postgres_table_is_never_asked_more_columns_than_the_server_holds() -> None:
    pg = {"type": "postgres", "dsn": "postgresql://db/x"}
    message = _error({"destinations": {"pg": {**pg, "max_columns": 3000}}})
    assert "destinations.pg: max_columns 3000: a PostgreSQL table holds at most 1600" in message
    config = parse_config({"destinations": {"pg": {**pg, "max_columns": 1600}}}, source="t", env={})
    assert config.destinations["pg"].max_columns == 1600
    # DuckDB holds more: its own limit is not PostgreSQL's.
    duck = {"type": "duckdb", "max_columns": 3000}
    assert parse_config({"destinations": {"w": duck}}, source="t", env={})


def test_two_destinations_that_would_write_the_same_tables_are_refused() -> None:
    """A batch and a stream DuckDB destination without a path each loaded every event
    into warehouse.duckdb's events table (6 rows for 3 events)."""
    both = {"warehouse": {"type": "duckdb"}, "live": {"type": "duckdb", "mode": "stream"}}
    message = _error({"destinations": both})
    assert "destinations 'warehouse' and 'live' write the same tables" in message
    assert "warehouse.duckdb" in message
    pg = {"type": "postgres", "dsn": "postgresql://u:secret@db/x"}
    message = _error({"destinations": {"a": pg, "b": {**pg, "mode": "stream"}}})
    assert "db:5432/x schema public" in message  # redacted: no user, no password
    assert "secret" not in message
    lakes = {"a": {"type": "parquet"}, "b": {"type": "parquet"}}
    assert "write the same tables" in _error({"destinations": lakes})
    shared = {"type": "iceberg", "catalog": {"namespace": "events"}}
    assert "namespace events" in _error({"destinations": {"a": shared, "b": shared}})
    # Apart: a file each, other keys, another template or namespace, or another schema.
    for fine in (
        {"a": {"type": "duckdb"}, "b": {"type": "duckdb", "path": "other.duckdb"}},
        {"a": {"type": "duckdb", "only_keys": ["web"]},
         "b": {"type": "duckdb", "only_keys": ["pg"]}},
        {"a": {"type": "duckdb"}, "b": {"type": "duckdb", "table_name_template": "raw"}},
        {"a": {"type": "duckdb"}, "b": {"type": "duckdb", "namespace": "^x$"}},
        {"a": pg, "b": {**pg, "schema": "other"}},
        {"a": {"type": "duckdb"}, "b": {"type": "parquet"}},
        {"a": {"type": "iceberg"}, "b": {"type": "iceberg"}},  # a namespace each
    ):  # fmt: skip
        assert parse_config({"destinations": fine}, source="eventpipe.yaml", env={})


def test_every_destination_with_tables_takes_a_sources_changes() -> None:
    fed = {"sources": {"pg": {"dsn": "postgresql://db/shop"}}}
    bq = {"type": "bigquery", "project": "p", "dataset": "events"}
    sf = {"type": "snowflake", "account": "a", "user": "u", "database": "D"}
    rs = {"type": "redshift", "dsn": "postgresql://u@cluster:5439/dev",
          "staging": "s3://bucket/staging", "iam_role": "default"}  # fmt: skip
    parse_config({"destinations": {"bq": bq, "sf": sf, "rs": rs}, **fed}, source="t", env={})
    assert (
        "string should match pattern"
        in _error({"destinations": {"bq": {**bq, "dataset": "my-events"}}}).lower()
    )


def test_a_redshift_destination_stages_on_s3_and_names_a_role() -> None:
    rs = {"type": "redshift", "dsn": "postgresql://u@cluster:5439/dev",
          "staging": "s3://bucket/staging", "iam_role": "default"}  # fmt: skip
    parse_config({"destinations": {"rs": rs}}, source="t", env={})
    assert "Redshift copies from S3" in _error(
        {"destinations": {"rs": {**rs, "staging": "/var/staging"}}}
    )
    assert "iam_role 'copy-role': the role's ARN" in _error(
        {"destinations": {"rs": {**rs, "iam_role": "copy-role"}}}
    )
    assert "at most 1600 columns" in _error({"destinations": {"rs": {**rs, "max_columns": 2000}}})
    assert "required key is missing" in _error({"destinations": {"rs": {"type": "redshift",
                                                                        "dsn": "x"}}})  # fmt: skip
