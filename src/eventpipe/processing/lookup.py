"""Lookup enrichment (seed 1): ``ip_lookup`` and ``user_agent_parse`` rules.

A rule reads the string at its ``from`` JSON pointer and writes an object at its ``to``
pointer. Both run as Arrow UDFs (``arrow_udf``): Spark hands each Python worker only the
one input column, in Arrow batches, and in every batch each distinct value is looked up
once (``dictionary_encode``, look up the dictionary, ``take`` back). Workers also keep a
bounded memo across batches, so ~200 distinct user agents in a million events cost ~200
parses per worker, not a million.

* ``ip_lookup`` reads any MaxMind-format ``.mmdb`` with ``maxminddb`` (MaxMind's own
  reader). City and Country databases fill the geo fields, ASN databases ``asn`` and
  ``as_org``; a field the database lacks is null. An address that is not in the database,
  or not an address, gives null. Default database: GeoLite2 City as packaged by
  ``maxminddb-geolite2`` (a 2018 snapshot, offline, CC BY-SA 4.0 by MaxMind); point
  ``enrichment.ip_database`` at a current one for real use.
* ``user_agent_parse`` uses ``ua-parser`` (the maintained Python port of uap-core, with its
  Rust accelerator). ``bot`` is true when uap-core calls the device a ``Spider``.

The Python workers import this module, so eventpipe must be installed where executors run
(on a cluster: the same package on every node, or ``spark.submit.pyFiles``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import types as T
from pyspark.sql.functions import arrow_udf  # type: ignore[attr-defined]

from eventpipe.errors import ConfigError

GEO_FIELDS: tuple[tuple[str, T.DataType, pa.DataType], ...] = (
    ("country", T.StringType(), pa.string()),
    ("country_name", T.StringType(), pa.string()),
    ("region", T.StringType(), pa.string()),
    ("city", T.StringType(), pa.string()),
    ("zip", T.StringType(), pa.string()),
    ("latitude", T.DoubleType(), pa.float64()),
    ("longitude", T.DoubleType(), pa.float64()),
    ("timezone", T.StringType(), pa.string()),
    ("asn", T.LongType(), pa.int64()),
    ("as_org", T.StringType(), pa.string()),
)
UA_FIELDS: tuple[tuple[str, T.DataType, pa.DataType], ...] = (
    ("ua_family", T.StringType(), pa.string()),
    ("ua_version", T.StringType(), pa.string()),
    ("os_family", T.StringType(), pa.string()),
    ("os_version", T.StringType(), pa.string()),
    ("device_family", T.StringType(), pa.string()),
    ("device_brand", T.StringType(), pa.string()),
    ("device_model", T.StringType(), pa.string()),
    ("bot", T.BooleanType(), pa.bool_()),
)
_MEMO_LIMIT = 100_000
"""Distinct values a worker remembers across batches (per rule); the memo is cleared when
full, which bounds worker memory whatever the traffic."""


def _spark_type(fields: tuple[tuple[str, T.DataType, pa.DataType], ...]) -> T.StructType:
    return T.StructType([T.StructField(name, spark) for name, spark, _ in fields])


def _arrow_type(fields: tuple[tuple[str, T.DataType, pa.DataType], ...]) -> pa.StructType:
    return pa.struct([(name, arrow) for name, _, arrow in fields])


GEO_TYPE = _spark_type(GEO_FIELDS)
UA_TYPE = _spark_type(UA_FIELDS)


def default_ip_database() -> str:
    """The packaged GeoLite2 City database (maxminddb-geolite2)."""
    from _maxminddb_geolite2 import geolite2_database  # type: ignore[import-untyped]

    return str(geolite2_database())


@functools.cache
def _reader(path: str) -> Any:
    import maxminddb

    return maxminddb.open_database(path)


def check_ip_database(path: str) -> None:
    """Open the database now, so that a bad path is a config error, not a failed run."""
    try:
        _reader(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"enrichment.ip_database: cannot read {path}: {exc}",
            fix="point it at a MaxMind-format .mmdb file",
        ) from None


def _name(record: dict[str, Any], key: str) -> str | None:
    names = record.get(key, {}).get("names", {})
    value = names.get("en")
    return value if isinstance(value, str) else None


def geo_of(path: str, ip: str) -> dict[str, Any] | None:
    """The geo fields of one address, or None when it is unknown or not an address."""
    try:
        record = _reader(path).get(ip)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    country = record.get("country") or record.get("registered_country") or {}
    subdivisions = record.get("subdivisions") or [{}]
    location = record.get("location") or {}
    found = {
        "country": country.get("iso_code"),
        "country_name": country.get("names", {}).get("en"),
        "region": subdivisions[0].get("iso_code"),
        "city": _name(record, "city"),
        "zip": (record.get("postal") or {}).get("code"),
        "latitude": location.get("latitude"),
        "longitude": location.get("longitude"),
        "timezone": location.get("time_zone"),
        "asn": record.get("autonomous_system_number"),
        "as_org": record.get("autonomous_system_organization"),
    }
    return found if any(v is not None for v in found.values()) else None


def user_agent_of(text: str) -> dict[str, Any] | None:
    """The parsed fields of one user agent string, or None when nothing is recognised."""
    from ua_parser import parse

    result = parse(text)
    ua, os_, device = result.user_agent, result.os, result.device
    if ua is None and os_ is None and device is None:
        return None

    def version(part: Any) -> str | None:
        numbers = [p for p in (part.major, part.minor, part.patch) if p] if part else []
        return ".".join(numbers) or None

    return {
        "ua_family": ua.family if ua else None,
        "ua_version": version(ua),
        "os_family": os_.family if os_ else None,
        "os_version": version(os_),
        "device_family": device.family if device else None,
        "device_brand": device.brand if device else None,
        "device_model": device.model if device else None,
        "bot": device is not None and device.family == "Spider",
    }


def lookup_distinct(
    values: pa.Array | pa.ChunkedArray,
    lookup: Callable[[str], dict[str, Any] | None],
    arrow_type: pa.StructType,
    memo: dict[str, dict[str, Any] | None],
) -> pa.Array:
    """``lookup`` of each value, calling it once per distinct value (and not at all for
    values already in ``memo``). Nulls stay null."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    encoded = pc.dictionary_encode(values)
    found = []
    for value in encoded.dictionary.to_pylist():
        if value not in memo:
            if len(memo) >= _MEMO_LIMIT:
                memo.clear()
            memo[value] = lookup(value)
        found.append(memo[value])
    return pa.array(found, type=arrow_type).take(encoded.indices)


def _ip_udf(database: str) -> Callable[[Column], Column]:
    memo: dict[str, dict[str, Any] | None] = {}
    arrow_type = _arrow_type(GEO_FIELDS)

    def ip_lookup(ips: pa.Array) -> pa.Array:
        return lookup_distinct(ips, functools.partial(geo_of, database), arrow_type, memo)

    return arrow_udf(ip_lookup, GEO_TYPE)  # type: ignore[no-any-return]


def _ua_udf() -> Callable[[Column], Column]:
    memo: dict[str, dict[str, Any] | None] = {}
    arrow_type = _arrow_type(UA_FIELDS)

    def user_agent_parse(agents: pa.Array) -> pa.Array:
        return lookup_distinct(agents, user_agent_of, arrow_type, memo)

    return arrow_udf(user_agent_parse, UA_TYPE)  # type: ignore[no-any-return]


RULE_NAMES = ("ip_lookup", "user_agent_parse")
TEXT_FIELDS = {
    "ip_lookup": tuple(n for n, t, _ in GEO_FIELDS if isinstance(t, T.StringType)),
    "user_agent_parse": tuple(n for n, t, _ in UA_FIELDS if isinstance(t, T.StringType)),
}
"""The text fields of each rule's result: never timestamps, so typing need not test them."""


def rule_function(name: str, ip_database: str) -> Callable[[Column], Column]:
    if name == "ip_lookup":
        return _ip_udf(ip_database)
    if name == "user_agent_parse":
        return _ua_udf()
    raise ConfigError(f"unknown enrichment rule {name!r} (known: {', '.join(RULE_NAMES)})")


def apply_rule(
    frame: DataFrame,
    function: Callable[[Column], Column],
    source: tuple[str, ...],
    target: tuple[str, ...],
    condition: Column | None = None,
) -> DataFrame:
    """``target`` set to ``function(source)`` (where ``condition`` holds, else left as is).

    A batch without the ``source`` field is returned unchanged; a value that is not a
    string is looked up as its text (``source_ip`` sent as a number finds nothing).
    """
    from eventpipe.processing.paths import column_at, set_path

    ref = column_at(frame.schema, source)
    if ref is None:
        return frame
    value = function(ref.cast("string"))
    return set_path(frame, target, value, condition)
