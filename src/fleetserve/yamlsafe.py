"""Reading YAML that users wrote: safe types, no silently dropped keys, bounded nesting.

PyYAML's ``safe_load`` keeps the *last* of two equal mapping keys, so a spec with two
``models:`` sections silently lost the first; here a repeated key is an error naming the
key and both lines. Its composer recurses once per nesting level, so a 20,000-deep list
ends in a RecursionError traceback; here it is a SpecError, and any document nested deeper
than :data:`MAX_DEPTH` (no fleet spec needs more than a handful of levels) is refused
before validation walks it.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode

from fleetserve.errors import SpecError

#: Deepest nesting of mappings/lists a document may have.
MAX_DEPTH = 64


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses repeated mapping keys (merge keys ``<<`` excepted)."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # unhashable key: the base constructor reports it
                continue
            if first is not None:
                raise ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key '{key}' (first at line {first + 1}); the second would "
                    "silently replace the first",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _check_depth(data: Any, source: str) -> None:
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise SpecError(f"{source}: nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


def load_yaml(text: str, source: str) -> Any:
    """The document in ``text``; every problem is a SpecError naming ``source``:line:col."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: safe types only
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise SpecError(f"{source}{where}: invalid YAML: {problem}") from e
    except RecursionError as e:
        raise SpecError(f"{source}: invalid YAML: nested too deeply") from e
    _check_depth(data, source)
    return data
