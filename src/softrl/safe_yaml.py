"""YAML as a config needs it, read safely: no key given twice (PyYAML keeps the later one without a
word) and no alias bomb (nine nested aliases of nine make 387 million values, which fill the memory
once something copies them)."""

from __future__ import annotations

import typing
from typing import Any

import yaml


class YAMLInputError(ValueError):
    """YAML that parses but that a config must not take; one line."""


MAX_YAML_NODES = 1_000_000  # values of a config once its aliases are expanded; a real one has hundreds


class _StrictLoader(yaml.SafeLoader):
    """A key given twice in one mapping is an error."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, typing.Hashable) and key in seen:
                raise YAMLInputError(f"key {key!r} is given twice (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """YAML with no key given twice and at most MAX_YAML_NODES values once aliases are expanded."""
    loaded = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader)
    if _expanded_size(loaded, {}) > MAX_YAML_NODES:
        raise YAMLInputError(f"more than {MAX_YAML_NODES:,} values once its aliases (*name) are expanded")
    return loaded


def _expanded_size(value: Any, sizes: dict[int, int]) -> int:
    """Values in `value`, a shared (aliased) one counted at each use; each distinct one visited once."""
    if not isinstance(value, (dict, list)):
        return 1
    if id(value) not in sizes:
        sizes[id(value)] = 0  # a recursive alias (`&a [*a]`) counts once
        children = [*value.keys(), *value.values()] if isinstance(value, dict) else value
        sizes[id(value)] = 1 + sum(_expanded_size(v, sizes) for v in children)
    return sizes[id(value)]
