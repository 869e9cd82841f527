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
  ``enrichment.ip_database`` at a current one for real use. On a cluster the database
  file goes to every executor with the job (``SparkContext.addFile``): only the driver
  needs it on its disk.
* ``user_agent_parse`` uses ``ua-parser`` (the maintained Python port of uap-core, with its
  Rust accelerator). ``bot`` is true when uap-core calls the device a ``Spider``.

The Python workers import this module, so eventpipe must be installed where executors run
(on a cluster: the same package on every node, or ``spark.submit.pyFiles``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.functions import arrow_udf  # type: ignore[attr-defined]
from pyspark.sql.types import StructType

from eventpipe.config import Config
from eventpipe.errors import ConfigError
from eventpipe.processing.steps.fields import column_at
from eventpipe.reserved import LOOKUP
from eventpipe.schema.naming import column_name
from eventpipe.schema.pointers import parse_pointer, pointer

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


_GEO_RECORD_LIMIT = 250_000
"""Database records a worker keeps decoded (about 110 bytes each as Arrow rows for
GeoLite2 City: 28 MB at most); 1M random IPv4 addresses met 112K distinct records."""


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
    return _geo_fields(record)


def _geo_fields(record: Any) -> dict[str, Any] | None:
    """eventpipe's geo fields of a database record (None when it has none of them)."""
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


class SearchTree:
    """The search tree of an ``.mmdb`` as arrays, to find many IPv4 addresses at once.

    Measured on GeoLite2 City (3.6M nodes), 1M random IPv4 addresses: ``Reader.get`` one
    by one decodes a whole record per address (~9-12 µs each: 9 s or more); walking the
    tree for all of them at once with numpy takes 0.7 s and finds 112K distinct records,
    so that each worker decodes each record once (with ``Reader.get`` of one of its
    addresses) instead of once per address. The tree format is MaxMind DB 2.0, section
    "Search Tree": node ``i`` holds two records of ``record_size`` bits, a value equal to
    ``node_count`` means "not found", greater means data.
    """

    def __init__(self, path: str) -> None:
        import numpy as np

        meta = _reader(path).metadata()
        self.node_count = count = int(meta.node_count)
        size = int(meta.record_size)
        if size not in (24, 28, 32):
            raise ValueError(f"{path}: unsupported record size {size}")
        width = size // 4  # bytes per node: two records
        raw = np.fromfile(path, dtype=np.uint8, count=count * width).reshape(count, width)
        b = raw.astype(np.uint32)
        if size == 28:  # the middle byte's high nibble belongs to the left record
            left = ((b[:, 3] & 0xF0) << 20) | (b[:, 0] << 16) | (b[:, 1] << 8) | b[:, 2]
            right = ((b[:, 3] & 0x0F) << 24) | (b[:, 4] << 16) | (b[:, 5] << 8) | b[:, 6]
        else:  # 24 or 32 bits: two big-endian numbers
            half = width // 2
            left, right = np.zeros(count, np.uint32), np.zeros(count, np.uint32)
            for i in range(half):
                left = (left << 8) | b[:, i]
                right = (right << 8) | b[:, half + i]
        self.children = np.stack([left, right], axis=1)
        # IPv4 addresses live under 96 zero bits in an IPv6 tree (::a.b.c.d).
        node = 0
        for _ in range(96 if meta.ip_version == 6 else 0):
            if node >= count:
                break
            node = int(self.children[node, 0])
        self.ipv4_start = node

    def find(self, addresses: Any) -> Any:
        """For each IPv4 address (uint32 array), its record's key (a tree value above
        ``node_count``), or -1 where it is not in the database."""
        import numpy as np

        nodes = np.full(len(addresses), self.ipv4_start, dtype=np.int64)
        for bit in range(31, -1, -1):
            inside = np.flatnonzero(nodes < self.node_count)
            if not len(inside):
                break
            bits = (addresses[inside] >> bit) & 1
            nodes[inside] = self.children[nodes[inside], bits]
        return np.where(nodes > self.node_count, nodes, -1)


@functools.cache
def _tree(path: str) -> SearchTree:
    return SearchTree(path)


_IPV4 = r"^" + r"\.".join(f"(?P<o{i}>0|[1-9]\\d{{0,2}})" for i in range(4)) + r"$"
"""Dotted-quad IPv4 without leading zeros, found through :class:`SearchTree`. Any other
text goes to the reader itself, which takes more forms (``1.2.3``), so that results are
always the reader's own."""


def ipv4_numbers(values: pa.Array) -> tuple[Any, Any]:
    """(uint32 address of each IPv4 text value, mask of the values that are IPv4)."""
    import numpy as np

    parts = pc.extract_regex(values, _IPV4)  # null where the text is not a dotted quad
    shaped = np.asarray(parts.is_valid().to_numpy(zero_copy_only=False))
    octets = [
        pc.cast(pc.if_else(shaped, parts.field(i), "0"), pa.int64()).to_numpy(zero_copy_only=False)
        for i in range(4)
    ]
    valid = shaped & np.all([o <= 255 for o in octets], axis=0)
    numbers: Any = np.zeros(len(values), dtype=np.uint32)
    for octet in octets:
        numbers = (numbers << 8) | np.where(valid, octet, 0).astype(np.uint32)
    return numbers, valid


class GeoRecords:
    """The geo fields of the database records a worker has met, as Arrow rows, by record
    key (:meth:`SearchTree.find`): each record is decoded once, and a batch's result is
    an Arrow ``take``, with no Python object per event. Bounded by ``_GEO_RECORD_LIMIT``.

    One per database and worker process (:func:`_geo_records`), kept across tasks: Spark
    reuses Python workers, and a closure's state would start empty in every task.
    """

    def __init__(self, path: str) -> None:
        import numpy as np

        self.path = path
        self.texts: dict[str, dict[str, Any] | None] = {}
        """Values that are not IPv4 addresses, by text."""
        self.keys = np.empty(0, dtype=np.int64)  # sorted
        self.rows = np.empty(0, dtype=np.int64)  # row of each key in ``chunks``
        self.chunks: list[pa.Array] = []
        self.size = 0

    def _positions(self, keys: Any) -> tuple[Any, Any]:
        import numpy as np

        at = np.searchsorted(self.keys, keys)
        known = at < len(self.keys)
        known[known] = self.keys[at[known]] == keys[known]
        return at, known

    def take(self, keys: Any, texts: list[str]) -> pa.Array:
        """The fields of each record of ``keys`` (distinct), ``texts[i]`` being an address
        of record ``keys[i]``."""
        import numpy as np

        at, known = self._positions(keys)
        new = np.flatnonzero(~known)
        if len(new):
            if self.size + len(new) > _GEO_RECORD_LIMIT:
                self.keys, self.rows = self.keys[:0], self.rows[:0]
                self.chunks, self.size = [], 0
                new = np.arange(len(keys))
            reader = _reader(self.path)
            decoded = [_geo_fields(reader.get(texts[i])) for i in new.tolist()]
            self.chunks.append(pa.array(decoded, type=_arrow_type(GEO_FIELDS)))
            rows = np.concatenate([self.rows, self.size + np.arange(len(new))])
            merged = np.concatenate([self.keys, keys[new]])
            order = np.argsort(merged, kind="stable")
            self.keys, self.rows = merged[order], rows[order]
            self.size += len(new)
            at, known = self._positions(keys)
        return pa.chunked_array(self.chunks, _arrow_type(GEO_FIELDS)).take(pa.array(self.rows[at]))


@functools.cache
def _geo_records(path: str) -> GeoRecords:
    return GeoRecords(path)


def geo_lookup(path: str, values: pa.Array) -> pa.Array:
    """The geo fields of each value of ``values`` (Arrow text), as an Arrow struct array.

    IPv4 addresses go through :class:`SearchTree` and :class:`GeoRecords`. Anything else
    (IPv6, not an address) is looked up once per distinct value with :func:`geo_of`,
    remembered by its text.
    """
    import numpy as np

    records = _geo_records(path)
    numbers, is_ipv4 = ipv4_numbers(values)
    keys = np.full(len(values), -1, dtype=np.int64)
    keys[is_ipv4] = _tree(path).find(numbers[is_ipv4])
    index = np.full(len(values), -1, dtype=np.int64)  # into parts, concatenated; -1: null
    found = np.flatnonzero(keys >= 0)
    distinct, first, inverse = np.unique(keys[found], return_index=True, return_inverse=True)
    texts = values.take(pa.array(found[first], pa.int64())).to_pylist()
    parts = [records.take(distinct, texts).combine_chunks()]
    index[found] = inverse
    others = np.flatnonzero(~is_ipv4 & np.asarray(values.is_valid().to_numpy(zero_copy_only=False)))
    if len(others):
        parts.append(
            lookup_distinct(
                values.take(pa.array(others)), functools.partial(geo_of, path),
                _arrow_type(GEO_FIELDS), records.texts,
            )
        )  # fmt: skip
        index[others] = len(distinct) + np.arange(len(others))
    return pa.concat_arrays(parts).take(pa.array(index, mask=index < 0))


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
    shipped = ship_file(database)

    def ip_lookup(ips: pa.Array) -> pa.Array:
        if isinstance(ips, pa.ChunkedArray):
            ips = ips.combine_chunks()
        return geo_lookup(local_file(database, shipped), ips)

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


def ship_file(path: str) -> str | None:
    """Send a file of the driver's to every executor with the job, when the session
    runs on a cluster, where executors may not see the driver's disk: ``addFile``, or
    for a Spark Connect client an artifact of its session. The name it has there
    (``SparkFiles.get``), or None in local mode."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    from pyspark.sql.utils import is_remote

    name = os.path.basename(path)
    if is_remote():  # this process is a Spark Connect client
        session: Any = SparkSession.active()  # the thread's, or the process's
        if (session.session_id, path) not in _SHIPPED:
            session.addArtifacts(path, file=True)
            _SHIPPED.add((session.session_id, path))
        return name
    context = SparkContext._active_spark_context
    if context is None or (context.master or "local").startswith("local"):
        return None
    if (context.applicationId, path) not in _SHIPPED:
        context.addFile(path)
        _SHIPPED.add((context.applicationId, path))
    return name


_SHIPPED: set[tuple[str, str]] = set()


def local_file(path: str, shipped: str | None) -> str:
    """On an executor: ``path`` where it exists (a shared disk, the packaged database),
    else the copy :func:`ship_file` sent."""
    if shipped is None or os.path.exists(path):
        return path
    from pyspark import SparkFiles

    return SparkFiles.get(shipped)


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
    from eventpipe.processing.steps.fields import set_path

    ref = column_at(frame.schema, source)
    if ref is None:
        return frame
    value = function(ref.cast("string"))
    return set_path(frame, target, value, condition)


@dataclass(frozen=True)
class LookupRule:
    name: str
    source: tuple[str, ...]
    target: tuple[str, ...]
    destinations: frozenset[str] | None
    """The destinations it belongs to; None: seed 1's implicit rule, for browser events
    of every destination."""

    @property
    def column(self) -> str:
        """Where the read pass keeps its results; rules reading the same field share it
        (an implicit rule's column has browser events' results only)."""
        scope = "browser_" if self.destinations is None else ""
        return f"{LOOKUP}{scope}{self.name}_{pointer(self.source)}"


@dataclass(frozen=True)
class Lookups:
    """Every lookup rule of a run, each distinct (rule, source) computed once, in the read
    pass, into a column of its own; destinations then place the results (``set_path``)."""

    database: str
    rules: tuple[LookupRule, ...]
    """Implicit rules first, then each destination's in its configured order."""

    @classmethod
    def plan(cls, config: Config) -> Lookups:
        database = str(config.enrichment.ip_database or default_ip_database())
        rules: list[LookupRule] = []
        if config.enrichment.browser_rules:
            rules += [LookupRule(name, src, dst, None) for name, src, dst in IMPLICIT_RULES]
        for dest_id, dest in config.destinations.items():
            for rule in dest.enrichment:
                src = parse_pointer(rule.source, where="enrichment.from")
                dst = parse_pointer(rule.to, where="enrichment.to")
                rules.append(LookupRule(rule.name, src, dst, frozenset({dest_id})))
        if any(rule.name == "ip_lookup" for rule in rules):
            check_ip_database(database)  # a bad path: a config error, not a failed run
        return cls(database, tuple(rules))

    def computed(self, schema: StructType, *, browser_events: bool = True) -> dict[str, Column]:
        """The lookup columns a batch with ``schema`` gets (rules whose source it has).
        Implicit rules look up browser events' values only: server events' are passed as
        null (Spark runs a UDF on every row, whatever condition is around it), and a batch
        known to hold no browser event (``browser_events`` false) gets no implicit rule
        at all: no Python worker is handed its rows for nothing."""
        out: dict[str, Column] = {}
        for rule in self.rules:
            if rule.destinations is None and not browser_events:
                continue
            ref = column_at(schema, rule.source)
            if ref is not None and rule.column not in out:
                function = rule_function(rule.name, self.database)
                value = ref.cast("string")
                if rule.destinations is None:
                    value = F.when(browser_of(schema), value)
                out[rule.column] = function(value)
        return out

    def for_destination(self, dest_id: str) -> list[LookupRule]:
        """The rules one destination applies, in order."""
        return [r for r in self.rules if r.destinations is None or dest_id in r.destinations]

    def text_columns(self, dest_id: str) -> set[str]:
        """The flattened columns of text fields a destination's lookups write."""
        return {
            column_name((*rule.target, field))
            for rule in self.for_destination(dest_id)
            for field in TEXT_FIELDS[rule.name]
        }


# Seed 1: applied to every browser event.
IMPLICIT_RULES = (
    ("ip_lookup", ("source_ip",), ("eventn_ctx", "location")),
    ("user_agent_parse", ("eventn_ctx", "user_agent"), ("eventn_ctx", "parsed_ua")),
)


def browser_of(schema: StructType) -> Column:
    """Browser events: the collector marks server events ``src: "api"`` (if absent)."""
    if "src" not in schema.fieldNames():
        return F.lit(True)
    return F.col("src").isNull() | (F.col("src").cast("string") != F.lit("api"))
