"""Loading untrusted YAML: the safe loader, behind a walk of the events that bounds the
nesting depth and refuses aliases.

Why: libyaml's composer recurses in C and segfaults on deep nesting (``[[[[...]]]]``), and
aliases let a small document expand exponentially ("billion laughs"). The event walk is
iterative, so it is safe on any input.
"""

from __future__ import annotations

from typing import Any

import yaml

SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_OPEN = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSE = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


class YamlRefused(ValueError):
    """The document nests too deeply or uses an alias."""


def bounded_load(text: str, *, max_depth: int, loader: Any = SafeLoader) -> Any:
    """``yaml.load(text, loader)`` after checking depth <= ``max_depth`` and no aliases.
    Raises YamlRefused, or yaml.YAMLError for a malformed document."""
    depth = 0
    for ev in yaml.parse(text, Loader=SafeLoader):
        if isinstance(ev, _OPEN):
            depth += 1
            if depth > max_depth:
                raise YamlRefused(f"nests deeper than {max_depth} levels")
        elif isinstance(ev, _CLOSE):
            depth -= 1
        elif isinstance(ev, yaml.AliasEvent):
            raise YamlRefused("uses an alias (*name), which is not allowed")
    return yaml.load(text, Loader=loader)
