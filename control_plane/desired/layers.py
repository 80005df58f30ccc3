"""Settings resolved in layers: product defaults, then the file's global block, then a group's
overrides, field by field. Each value remembers where it was written, so a check that fails on
the resolved result blames the line the operator actually wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from control_plane.desired.errors import At
from control_plane.desired.fields import Converter, Fields

DEFAULTS, GLOBAL, GROUP = 0, 1, 2


class Located(NamedTuple):
    value: Any  # None when the written value was bad (its problem is already recorded)
    at: At | None  # None for product defaults
    layer: int


Layer = dict[str, Located]
FieldTable = Mapping[str, tuple[str, Converter[Any]]]  # YAML key -> (model field, converter)


def defaults_layer(values: Mapping[str, Any]) -> Layer:
    return {key: Located(value, None, DEFAULTS) for key, value in values.items()}


def read_layer(fields: Fields, table: FieldTable, layer: int) -> Layer:
    """The table's keys present in the mapping, by model field name."""
    result: Layer = {}
    for key, (field_name, convert) in table.items():
        if fields.has(key):
            result[field_name] = Located(fields.read(key, convert), fields.at(key), layer)
        else:
            fields.node_of(key)
    return result


def blame(fallback: At, *values: Located) -> At:
    """Where to report a check over several values: the most specific layer that wrote one."""
    written = [v for v in values if v.at is not None]
    if not written:
        return fallback
    return max(written, key=lambda v: v.layer).at or fallback


def known(*values: Located) -> bool:
    """All values are usable (none failed its own check)."""
    return all(v.value is not None for v in values)

