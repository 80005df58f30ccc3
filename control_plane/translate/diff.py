"""Field-level differences between two renderings of a PoP (what `ballast plan` shows).

Inputs are JSON-shaped renderings: resource kind -> resource name -> the resource as a dict.
Lists are compared item by item; lists of named items (HTTP filters) whose names differ are
matched by name, and an item (or a mapping) only on one side is shown field by field.
Pure: no I/O, so the same function serves `ballast plan`, `config_applied` records and tests.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Action = Literal["add", "change", "remove"]
Rendering = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class FieldChange:
    path: str  # e.g. circuit_breakers.thresholds[0].max_pending_requests
    old: Any
    new: Any

    def __str__(self) -> str:
        if self.old is _MISSING:
            return f"{self.path}: + {_short(self.new)}"
        if self.new is _MISSING:
            return f"{self.path}: - {_short(self.old)}"
        return f"{self.path}: {_short(self.old)} -> {_short(self.new)}"


@dataclass(frozen=True)
class ResourceChange:
    kind: str
    name: str
    action: Action
    fields: tuple[FieldChange, ...] = ()


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()


def diff_renderings(old: Rendering, new: Rendering) -> list[ResourceChange]:
    """Resources added, changed (with their changed fields) and removed, in a stable order."""
    changes: list[ResourceChange] = []
    for kind in sorted(set(old) | set(new)):
        before, after = old.get(kind, {}), new.get(kind, {})
        for name in sorted(set(before) | set(after)):
            if name not in before:
                changes.append(ResourceChange(kind, name, "add"))
            elif name not in after:
                changes.append(ResourceChange(kind, name, "remove"))
            else:
                fields = tuple(_diff_values("", before[name], after[name]))
                if fields:
                    changes.append(ResourceChange(kind, name, "change", fields))
    return changes


def _diff_values(path: str, old: Any, new: Any) -> Iterator[FieldChange]:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            child = f"{path}.{key}" if path else str(key)
            yield from _diff_values(child, old.get(key, _MISSING), new.get(key, _MISSING))
    elif isinstance(old, list) and isinstance(new, list) and _names(old) is not None \
            and _names(new) is not None and _names(old) != _names(new):
        # items with names (HTTP filters, say) added, removed or moved: matched by name
        before = {item["name"]: item for item in old}
        after = {item["name"]: item for item in new}
        for name in [*after, *(n for n in before if n not in after)]:
            yield from _diff_values(f"{path}[{name}]", before.get(name, _MISSING),
                                    after.get(name, _MISSING))
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for index, (a, b) in enumerate(zip(old, new, strict=True)):
            yield from _diff_values(f"{path}[{index}]", a, b)
    elif (isinstance(new, dict) and old is _MISSING) or (isinstance(old, dict)
                                                          and new is _MISSING):
        for key in (new if old is _MISSING else old):
            yield from _diff_values(f"{path}.{key}", old if old is _MISSING else old[key],
                                    new if new is _MISSING else new[key])
    elif old != new:
        yield FieldChange(path, old, new)


def _names(items: list[Any]) -> tuple[str, ...] | None:
    """The items' names when every item is a mapping with a distinct `name`, else None."""
    names = tuple(item.get("name") for item in items if isinstance(item, dict))
    if len(names) != len(items) or not all(isinstance(n, str) for n in names) \
            or len(set(names)) != len(names):
        return None
    return names  # type: ignore[return-value]


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_SYMBOL = {"add": "+", "change": "~", "remove": "-"}


def format_changes(changes: list[ResourceChange], indent: str = "  ") -> list[str]:
    lines: list[str] = []
    for change in changes:
        lines.append(f"{indent}{_SYMBOL[change.action]} {change.kind} {change.name}")
        lines.extend(f"{indent}    {field}" for field in change.fields)
    return lines


def summarize(changes: list[ResourceChange]) -> str:
    counts = {action: 0 for action in _SYMBOL}
    for change in changes:
        counts[change.action] += 1
    return f"{counts['add']} to add, {counts['change']} to change, {counts['remove']} to remove"
