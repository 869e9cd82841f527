"""Reading eventpipe.yaml: environment variables expanded, the models validated, and
every problem reported as ``path: what was expected``, with a hint for a misspelt key
and the type that takes a key given to another type's destination."""

from __future__ import annotations

import difflib
import json
import os
import re
import secrets
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from eventpipe.config.collector import ApiKey
from eventpipe.config.destinations import TYPES, DestinationConfig
from eventpipe.config.root import Config, LoadedConfig
from eventpipe.errors import ConfigError
from eventpipe.files import write_file
from eventpipe.yamlfiles import load_yaml

DEFAULT_CONFIG_PATH = Path("eventpipe.yaml")

_ENV_REF = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")


def _expand_env(node: Any, path: str, env: dict[str, str]) -> Any:
    if isinstance(node, dict):
        return {k: _expand_env(v, _join(path, str(k)), env) for k, v in node.items()}
    if isinstance(node, list):
        return [_expand_env(v, f"{path}[{i}]", env) for i, v in enumerate(node)]
    if isinstance(node, str):

        def substitute(match: re.Match[str]) -> str:
            name, default = match["name"], match["default"]
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise ConfigError(
                f"{path}: environment variable {name} is not set",
                fix=f"export {name}=... or write ${{{name}:-default}}",
            )

        return _ENV_REF.sub(substitute, node)
    return node


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds: ``X``, ``X | None``, ``tuple[X, ...]``,
    ``dict[str, X]``, a union of models (destinations), ``Annotated`` around any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        args = args[:1]
    elif typing.get_origin(annotation) is dict:
        args = args[1:]
    for arg in args:
        found += [m for m in _models(arg) if m not in found]
    return found


def _field(model: type[BaseModel], name: str) -> Any:
    """The field ``name`` of ``model`` (by its key in YAML: alias first), or None."""
    for field_name, field in model.model_fields.items():
        if (field.alias or field_name) == name or field_name == name:
            return field
    return None


def _resolve(loc: tuple[int | str, ...]) -> tuple[str, list[type[BaseModel]]]:
    """An error's location as the user wrote it (without the destination's ``type``,
    which pydantic adds after a destination's id), and the models of its keys."""
    path, models = "", list[type[BaseModel]]([Config])
    expect = "field"  # the next part: a field, a dict's key, or the tag of a union
    for part in loc:
        if expect == "tag" and str(part) in TYPES:
            models, expect = [TYPES[str(part)]], "field"
            continue
        if isinstance(part, int):
            path, expect = f"{path}[{part}]", "field"
            continue
        path = _join(path, part)
        if expect == "key":
            expect = "tag" if len(models) > 1 else "field"
            continue
        field = next((f for f in (_field(m, part) for m in models) if f is not None), None)
        if field is None:
            expect = "field"
            continue
        models = _models(field.annotation)
        expect = "key" if typing.get_origin(field.annotation) is dict else "field"
    return path or "(top level)", models


def _describe(error: Any) -> str:
    kind, msg, value = error["type"], error["msg"], error.get("input")
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind == "union_tag_not_found":
        return f"required key is missing ({_choices(TYPES)})"
    if kind == "union_tag_invalid":
        return f"expected {_choices(TYPES)}, got {error['ctx']['tag']!r}"
    if kind.startswith("value_error"):
        return str(msg).removeprefix("Value error, ")
    text = str(msg).replace("Input should be", "expected").replace("Input", "value")
    if not isinstance(value, dict | list):
        text += f", got {value!r}"
    return text


def _choices(names: typing.Iterable[str]) -> str:
    *first, last = names
    return f"{', '.join(first)} or {last}" if first else last


def _hint(key: str, holders: list[type[BaseModel]]) -> str:
    """Why a key is unknown here: another destination type's key, or a misspelling."""
    takers = [t for t, model in TYPES.items() if _field(model, key) is not None]
    if takers and all(issubclass(m, DestinationConfig) for m in holders):
        return f" ({key} is for type {_choices(takers)})"
    known = list(dict.fromkeys(f.alias or n for m in holders for n, f in m.model_fields.items()))
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (known keys: {', '.join(known)})" if known else ""


def format_validation_error(exc: ValidationError) -> str:
    """One line per problem: ``path: what was expected``, with a hint for unknown keys."""
    lines = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        path, _ = _resolve(loc)
        if error["type"].startswith("union_tag_"):  # a destination's type
            path = _join(path, "type")
        line = f"{path}: {_describe(error)}"
        if error["type"] == "extra_forbidden":
            _, holders = _resolve(loc[:-1])
            line += _hint(str(loc[-1]), holders)
        lines.append(line)
    return "\n".join(lines)


def parse_config(data: Any, *, source: str, env: dict[str, str] | None = None) -> Config:
    """Validate already-parsed YAML. Raises ConfigError listing every problem."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of keys at the top level")
    data = _expand_env(data, "", dict(os.environ) if env is None else env)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source} is not valid:\n{format_validation_error(exc)}") from None


def load_config(path: Path | None = None) -> LoadedConfig:
    """Read ``path`` (default ``./eventpipe.yaml``); built-in defaults when it does not exist.

    An explicitly named file that does not exist is an error; the default one is optional.
    """
    explicit = path is not None
    path = path or DEFAULT_CONFIG_PATH
    if not path.exists():
        if explicit:
            raise ConfigError(
                f"config file {path} does not exist", fix="run `eventpipe init` to write one"
            )
        return LoadedConfig(config=Config(), source="built-in defaults", embedded=True)
    try:
        data = load_yaml(path.read_text(encoding="utf-8"), str(path))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    return LoadedConfig(
        config=parse_config(data, source=str(path)), source=str(path), embedded=False
    )


def with_dev_keys(config: Config) -> tuple[Config, ApiKey]:
    """Give an embedded-defaults config one development key pair, kept in ``dev_keys.json``.

    The pair is generated once per data directory (random, not a well-known value, because
    ``server.host`` may be opened to the network) and reused, so a curl line keeps working.
    """
    path = config.layout.dev_keys
    if path.exists():
        stored = json.loads(path.read_text(encoding="utf-8"))
    else:
        stored = {
            "id": "dev",
            "js": "js." + secrets.token_urlsafe(18),
            "server": "s2s." + secrets.token_urlsafe(18),
        }
        write_file(path, json.dumps(stored), private=True)
    key = ApiKey.model_validate(stored)
    return config.model_copy(update={"api_keys": (key,)}), key


def iter_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf field path of a model (``server.port``, ``api_keys[].id``,
    ``destinations.*.dsn``) with its info; a field several destination types share is
    given once."""
    seen: set[str] = set()
    for name, field in model.model_fields.items():
        path = _join(prefix, field.alias or name)
        nested = _models(field.annotation)
        if not nested:
            yield path, field
            continue
        origin = typing.get_origin(field.annotation)
        if origin is dict:
            path += ".*"
        elif nested[0] is not field.annotation and origin in (tuple, list):
            path += "[]"
        for inner in nested:
            for found in iter_fields(inner, path):
                if found[0] not in seen:
                    seen.add(found[0])
                    yield found
