"""Keys are matched by secret and kind; origins by exact, wildcard and any-scheme patterns."""

from __future__ import annotations

import pytest

from eventpipe.collector.auth import KeyKind, KeyRing, origin_allowed
from eventpipe.config import ApiKey

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
    ],
)
def test_origin_patterns(origin: str, patterns: list[str], allowed: bool) -> None:
    assert origin_allowed(origin, [p.lower() for p in patterns]) is allowed
