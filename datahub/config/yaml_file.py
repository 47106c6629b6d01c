"""The one reader of YAML files (job specs, storage configs, lake files): errors name the file, the line
and column of a syntax error, and what to do."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from datahub.errors import SpecError


def read_yaml(path: str | os.PathLike[str], *, missing: str) -> Any:
    """The parsed YAML at ``path``; ``missing`` completes the message for a file that does not exist."""
    source = os.fspath(path)
    try:
        text = Path(source).read_text()
    except FileNotFoundError:
        raise SpecError(f"{source}: {missing}") from None
    except OSError as exc:
        raise SpecError(f"{source}: cannot read: {exc.strerror}") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        raise SpecError(f"{source}:{where} not valid YAML: {getattr(exc, 'problem', None) or exc}") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping: YAML keeps the last silently, so a
    copied graph node left under the same name (or a second ``limits:``) would vanish without a word."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden here
                continue
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            try:
                hash(key)
            except TypeError:  # `? [a, b]`: SafeLoader's own construct_mapping says "found unhashable key" with the line
                continue
            if key in seen:
                first = seen[key].start_mark.line + 1
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {first}); rename or remove one",
                    key_node.start_mark)
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)
