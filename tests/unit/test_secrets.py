"""The last step before the collector writes: no secret, no writeKey field."""

from __future__ import annotations

import orjson

from eventpipe.collector.secrets import Scrubber

SECRET = "js-web-secret-1"


def _lines(*documents: object) -> bytes:
    return b"".join(orjson.dumps(d) + b"\n" for d in documents)


def test_a_secret_is_redacted_wherever_it_is() -> None:
    scrub = Scrubber([SECRET, "srv-secret-22", 'quo"te\\secret'])
    data = _lines({"a": SECRET, "b": {"c": [f"Bearer {SECRET}"]}},
                  {"error": "x", "raw": f'{{"writeKey": "{SECRET}"}}'},
                  {"q": 'quo"te\\secret'})  # fmt: skip
    out = scrub(data)
    assert SECRET.encode() not in out
    documents = [orjson.loads(line) for line in out.splitlines()]  # still JSON, line by line
    assert documents[0] == {"a": "[redacted]", "b": {"c": ["Bearer [redacted]"]}}
    assert documents[1]["raw"] == '{"writeKey": "[redacted]"}'
    assert documents[2] == {"q": "[redacted]"}


def test_write_key_fields_go_at_any_depth_and_casing() -> None:
    scrub = Scrubber([SECRET])
    data = _lines({"writeKey": "other", "context": {"WRITEKEY": 1, "list": [{"WriteKey": "z"}]},
                   "big": 1844674407370955161},
                  {"untouched": "writekey is a word here"})  # fmt: skip
    data = data.replace(b"1844674407370955161", b"184467440737095516170")  # past 64 bits
    first, second = scrub(data).splitlines()
    assert first == b'{"context":{"list":[{}]},"big":184467440737095516170}'
    assert orjson.loads(second) == {"untouched": "writekey is a word here"}


def test_nothing_to_scrub_leaves_the_bytes_as_they_are() -> None:
    data = _lines({"a": 1}, {"b": "two"})
    assert Scrubber([SECRET])(data) is data
