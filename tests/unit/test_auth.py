"""Keys are matched by secret and kind; origins by exact, wildcard and any-scheme patterns."""

from __future__ import annotations

import pytest

from eventpipe.collector.auth import KeyKind, KeyRing
from eventpipe.config import ApiKey
from eventpipe.origins import origin_allowed

KEYS = [
    ApiKey.model_validate({"id": "web", "js": "js-secret-1", "server": "srv-secret-1"}),
    ApiKey.model_validate({"id": "app", "server": "srv-secret-2"}),
]


def test_tokens_map_to_their_key_and_kind() -> None:
    ring = KeyRing(KEYS)
    web_js = ring.match("js-secret-1")
    web_server = ring.match("srv-secret-1")
    app_server = ring.match("srv-secret-2")
    assert web_js is not None
    assert (web_js.key.id, web_js.kind) == ("web", KeyKind.JS)
    assert web_server is not None
    assert (web_server.key.id, web_server.kind) == ("web", KeyKind.SERVER)
    assert app_server is not None
    assert (app_server.key.id, app_server.kind) == ("app", KeyKind.SERVER)


@pytest.mark.parametrize("token", [None, "", "js-secret-", "js-secret-11", "JS-SECRET-1", "web"])
def test_anything_else_matches_nothing(token: str | None) -> None:
    assert KeyRing(KEYS).match(token) is None


def test_only_keys_with_a_js_secret_serve_browsers() -> None:
    assert [k.id for k in KeyRing(KEYS).keys_with_js()] == ["web"]


@pytest.mark.parametrize(
    ("origin", "patterns", "allowed"),
    [
        ("https://shop.example.com", [], True),
        ("https://shop.example.com", ["*"], True),
        ("https://shop.example.com", ["https://shop.example.com"], True),
        ("https://shop.example.com/", ["https://shop.example.com"], True),
        ("HTTPS://Shop.Example.com", ["https://shop.example.com"], True),
        ("http://shop.example.com", ["https://shop.example.com"], False),
        ("https://shop.example.com:8443", ["https://shop.example.com"], False),
        ("https://a.example.org", ["https://*.example.org"], True),
        ("https://a.b.example.org", ["https://*.example.org"], True),
        ("https://example.org", ["https://*.example.org"], False),
        ("https://evilexample.org", ["https://*.example.org"], False),
        ("https://example.org.evil.com", ["https://*.example.org"], False),
        ("http://a.example.org", ["*.example.org"], True),
        ("https://shop.example.com", ["shop.example.com"], True),
        ("null", ["https://shop.example.com"], False),
        # Text that is not an origin matches nothing, whatever it ends with.
        ("https://evil.com/.example.com", ["https://*.example.com"], False),
        ("https://evil.com#.example.com", ["https://*.example.com"], False),
        ("https://evil.com?.example.com", ["https://*.example.com"], False),
        ("https://user@a.example.com", ["https://*.example.com"], False),
        ("https://a.example.com@evil.com", ["https://*.example.com"], False),
        ("https://evil.com\\.example.com", ["https://*.example.com"], False),
        ("https://a.example.com.", ["https://*.example.com"], False),
        ("https://a.example.com/path", ["https://a.example.com"], False),
        ("shop.example.com", ["shop.example.com"], False),  # no scheme: not an origin
        # Ports: the default only, unless the pattern names one or any.
        ("https://a.example.com:443", ["https://*.example.com"], True),
        ("https://a.example.com:8443", ["https://*.example.com"], False),
        ("https://a.example.com:8443", ["https://*.example.com:8443"], True),
        ("https://a.example.com:9000", ["https://*.example.com:*"], True),
        ("http://localhost:5173", ["http://localhost:*"], True),
        ("http://[::1]:8080", ["http://[::1]:8080"], True),
    ],
)
def test_origin_patterns(origin: str, patterns: list[str], allowed: bool) -> None:
    assert origin_allowed(origin, [p.lower() for p in patterns]) is allowed


@pytest.mark.parametrize(
    "pattern", ["https://a.example.com/path", "https://*.example.com#x", "a b", "https://", ""]
)
def test_a_pattern_that_is_not_an_origin_is_a_config_error(pattern: str) -> None:
    from pydantic import ValidationError

    from eventpipe.config import ApiKey

    with pytest.raises(ValidationError, match="not an origin pattern"):
        ApiKey(id="web", js="js-secret-1", origins=(pattern,))
