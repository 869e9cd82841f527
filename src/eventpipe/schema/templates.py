"""The syntax of ``table_name_template``, parsed without Spark, so that the config check
refuses a template that would not compile (processing/steps/template.py compiles it to a Spark
column expression).

Literal text with ``{{ path.to.field }}`` placeholders, and a date filter for timestamps:
``{{ _timestamp | date('%Y_%m') }}`` (strftime codes %Y %y %m %d %H %M %S %j %%).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from eventpipe.errors import ConfigError

_PLACEHOLDER = re.compile(
    r"\{\{\s*(?P<path>[^|}\s]+)\s*(?:\|\s*date\(\s*'(?P<fmt>[^']*)'\s*\)\s*)?\}\}"
)
_PATH = re.compile(r"^[A-Za-z0-9_$@-]+(?:\.[A-Za-z0-9_$@-]+)*$")
_STRFTIME = {"Y": "yyyy", "y": "yy", "m": "MM", "d": "dd", "H": "HH", "M": "mm", "S": "ss",
             "j": "DDD"}  # fmt: skip


@dataclass(frozen=True)
class Placeholder:
    path: tuple[str, ...]
    date_format: str | None


@dataclass(frozen=True)
class Template:
    text: str
    parts: tuple[str | Placeholder, ...]

    @classmethod
    def parse(cls, text: str, *, where: str = "table_name_template") -> Template:
        parts: list[str | Placeholder] = []
        position = 0
        for match in _PLACEHOLDER.finditer(text):
            parts.append(text[position : match.start()])
            path = match["path"]
            if not _PATH.match(path):
                raise ConfigError(f"{where}: {path!r} is not a field path like a.b.c")
            fmt = match["fmt"]
            if fmt is not None:
                java_date_pattern(fmt, where=where)  # validate now, not per batch
            parts.append(Placeholder(tuple(path.split(".")), fmt))
            position = match.end()
        rest = text[position:]
        if "{{" in rest or "}}" in rest:
            raise ConfigError(f"{where}: unbalanced or unsupported placeholder in {text!r}")
        parts.append(rest)
        return cls(text, tuple(p for p in parts if p != ""))

    @property
    def literal(self) -> str | None:
        """The text of a template without placeholders (every event gets the same table:
        no query needed to name it); None if it has any."""
        if self.parts and all(isinstance(p, str) for p in self.parts):
            return "".join(p for p in self.parts if isinstance(p, str))
        return None


def java_date_pattern(strftime: str, *, where: str = "table_name_template") -> str:
    """``%Y_%m`` -> ``yyyy'_'MM`` (literal text quoted for Spark's date_format)."""
    out: list[str] = []
    literal = ""
    i = 0
    while i < len(strftime):
        char = strftime[i]
        if char == "%" and i + 1 < len(strftime):
            code = strftime[i + 1]
            i += 2
            if code == "%":
                literal += "%"
                continue
            if code not in _STRFTIME:
                raise ConfigError(f"{where}: date code %{code} is not supported")
            if literal:
                out.append("'" + literal.replace("'", "''") + "'")
                literal = ""
            out.append(_STRFTIME[code])
        else:
            literal += char
            i += 1
    if literal:
        out.append("'" + literal.replace("'", "''") + "'")
    return "".join(out)
