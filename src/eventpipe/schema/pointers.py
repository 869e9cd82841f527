"""JSON pointers (RFC 6901): how config names a field of an event.

Config names fields by JSON pointer: ``/eventn_ctx/user_agent``. ``~1`` is ``/`` and ``~0``
is ``~`` inside a key. A text without a leading ``/`` is read as a pointer all the same
(``a/b`` is ``/a/b``), as seed 1 allows ``dst: just_field_name``.
"""

from __future__ import annotations

from eventpipe.errors import ConfigError


def parse_pointer(text: str, *, where: str) -> tuple[str, ...]:
    if text in ("", "/"):
        raise ConfigError(f"{where}: {text!r} does not name a field")
    body = text[1:] if text.startswith("/") else text
    keys = tuple(k.replace("~1", "/").replace("~0", "~") for k in body.split("/"))
    return keys


def pointer(path: tuple[str, ...]) -> str:
    return "".join("/" + k.replace("~", "~0").replace("/", "~1") for k in path)
