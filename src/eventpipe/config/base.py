"""What every section of the configuration shares: the model's rules (unknown keys are
errors, values frozen, field docstrings are the documentation) and the checked kinds of
text that several sections take (ids, origins, networks, pointers, type names, field
paths, SQL names) and how an object store is reached."""

from __future__ import annotations

import ipaddress
import re
from typing import TYPE_CHECKING, Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from eventpipe.errors import ConfigError
from eventpipe.origins import parse_origin
from eventpipe.paths import check_safe_id

if TYPE_CHECKING:
    from eventpipe.objectstore import S3Settings


class Section(BaseModel):
    """A part of eventpipe.yaml: unknown keys rejected, frozen, documented by docstrings."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, validate_default=True,
        populate_by_name=True,
    )  # fmt: skip


def _safe_key_id(value: str) -> str:
    return check_safe_id(value, "key id")


def _safe_destination_id(value: str) -> str:
    return check_safe_id(value, "destination id")


def _origin_pattern(value: str) -> str:
    if value != "*" and parse_origin(value, pattern=True) is None:
        raise ValueError(
            f"origin {value!r} is not an origin pattern: scheme://host[:port], where the "
            "scheme may be left out, the host may start with *. and the port may be *"
        )
    return value.rstrip("/").lower()


def _network(value: str) -> str:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError as exc:
        raise ValueError(f"{value!r} is not an IP address or CIDR network") from exc
    return value


def _pointer(value: str) -> str:
    from eventpipe.schema.pointers import parse_pointer

    try:
        parse_pointer(value, where="pointer")
    except ConfigError as exc:
        raise ValueError(exc.message) from None
    return value


def _type_name(value: str) -> str:
    from eventpipe.schema.types import parse_type

    try:
        parse_type(value)
    except ConfigError as exc:
        raise ValueError(exc.message.removeprefix("type: ")) from None
    return value


SQL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")
"""A schema or table name as PostgreSQL takes it unquoted (at most 63 characters)."""
_FIELD_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def _field_path(value: str) -> str:
    if not _FIELD_PATH.match(value):
        raise ValueError(
            f"{value!r}: a field is a name or a dotted path of names (properties.usage_gb)"
        )
    return value


def regular_expression(value: str, what: str) -> str:
    """``value``, or ValueError unless it is a regular expression."""
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"{what} {value!r} is not a regular expression: {exc}") from None
    return value


def sql_name(value: str, what: str) -> None:
    """ValueError unless ``value`` is a plain SQL name."""
    if not SQL_NAME.match(value):
        raise ValueError(f"{what} {value!r}: use letters, digits and _ (at most 63)")


SafeKeyId = Annotated[str, AfterValidator(_safe_key_id)]
DestinationId = Annotated[str, AfterValidator(_safe_destination_id)]
OriginPattern = Annotated[str, AfterValidator(_origin_pattern)]
Network = Annotated[str, AfterValidator(_network)]
Pointer = Annotated[str, AfterValidator(_pointer)]
TypeName = Annotated[str, AfterValidator(_type_name)]
FieldPath = Annotated[str, AfterValidator(_field_path)]


class S3Config(Section):
    """How a lake on ``s3://bucket/prefix`` is reached (AWS S3 or an S3-compatible store:
    MinIO, R2, Ceph). Each key absent here comes from the standard AWS environment
    variable (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``), then from the libraries' own
    defaults (profiles, instance metadata)."""

    endpoint: str | None = None
    """The store's ``http(s)://host:port``, for one other than AWS S3 (path-style
    requests)."""
    region: str | None = None
    """The bucket's region (``us-east-1``...)."""
    access_key_id: str | None = Field(default=None, repr=False)
    """The access key: ``${AWS_ACCESS_KEY_ID}`` (never logged, never written)."""
    secret_access_key: str | None = Field(default=None, repr=False)
    """Its secret: ``${AWS_SECRET_ACCESS_KEY}`` (never logged, never written)."""
    session_token: str | None = Field(default=None, repr=False)
    """A temporary credential's token: ``${AWS_SESSION_TOKEN}``."""

    @field_validator("endpoint")
    @classmethod
    def _endpoint_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"endpoint {value!r}: write http(s)://host:port")
        return value

    def settings(self) -> S3Settings:
        from eventpipe.objectstore import S3Settings

        return S3Settings(self.endpoint, self.region, self.access_key_id,
                          self.secret_access_key, self.session_token)  # fmt: skip
