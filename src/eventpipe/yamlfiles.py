"""YAML as eventpipe reads its own files (the config, tracking plans, metering seeds):
PyYAML's safe loader, but a key given twice in one mapping is an error.

PyYAML keeps the last of two equal keys without a word, so a setting added to a mapping
that already had it (``on_violation: quarantine`` added under a destination whose
generated config says ``on_violation: flag`` further down) was silently overridden.
Keys merged in with ``<<`` may still be overridden by the mapping's own, as YAML says.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode


class _Loader(yaml.SafeLoader):
    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                seen = first.get(key)
            except TypeError:  # an unhashable key: PyYAML's own error says so below
                continue
            if seen is not None:
                raise ConstructorError(
                    None, None,
                    f"{key!r} is given twice in one mapping (first on line {seen}): keep one",
                    key_node.start_mark,
                )  # fmt: skip
            first[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str | bytes, name: str | None = None) -> Any:
    """The YAML document in ``text`` (yaml.YAMLError when it is not valid, or a mapping
    gives a key twice; its place named by ``name``, the file's path)."""
    loader = _Loader(text)  # a SafeLoader: no Python objects
    if name is not None:
        loader.name = name
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
