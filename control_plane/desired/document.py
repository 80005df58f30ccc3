"""The desired state being read: where its problems go, what the sections read so far hold (the
PoPs, the tiers, the global policy layers, the origin groups), how certificate files are read,
and the helpers every section reads with.

Each section of the file has its reader (`validate.py` calls them in order: `pops`, `tiers`,
`failover`, `tier_actions`, `standby_ramp`, `access_log` and `rollout` in `validate.py` and
`policies.py`; `origin_groups.py`, `grpc_services.py`, `classification.py`, `listeners.py`),
each a function of the `Document` and the section's fields.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import yaml

from control_plane.desired.errors import At, Sink
from control_plane.desired.fields import Bad, Fields, check_name, did_you_mean, name, sequence, text
from control_plane.desired.filter_types import AllowedFilters
from control_plane.desired.layers import Layer, Located
from control_plane.desired.model import OriginGroup, Pop
from control_plane.desired.schema import (
    FAILOVER_DEFAULTS,
    STANDBY_RAMP_DEFAULTS,
    TIER_ACTION_DEFAULTS,
)
from control_plane.desired.yaml_nodes import join


class Files(Protocol):
    """How certificate files are read while the document is checked (the loader's, or a
    test's), and the time their dates are judged at."""

    now_s: float

    def read(self, path: str) -> bytes:
        """The file's bytes; OSError when it cannot be read."""

    def exists(self, path: str) -> bool: ...


class NoFiles:
    """Every file is missing (documents checked without a file system)."""

    now_s = 0.0

    def read(self, path: str) -> bytes:
        raise FileNotFoundError(2, "No such file or directory", path)

    def exists(self, path: str) -> bool:
        return False


@dataclass(frozen=True)
class Named:
    """A name read from a key or a `name:` field, with where it was written."""

    name: str
    at: At


def quoted(names: list[str]) -> str:
    return ", ".join(f"'{n}'" for n in names)


class Document:
    """One file being read: its problems (`sink`), its certificate files, the filter types it may
    use, and what the sections read so far found, which the later ones check against."""

    def __init__(self, sink: Sink, files: Files, allowed_filters: AllowedFilters) -> None:
        self.sink = sink
        self.files = files
        self.allowed_filters = allowed_filters
        self.pops: dict[str, Pop] = {}
        self.tier_layers: dict[str, Layer] = {}
        self.tiers_at = At(1, 1, "tiers")
        self.failover: Layer = dict(FAILOVER_DEFAULTS)
        self.tier_actions: Layer = dict(TIER_ACTION_DEFAULTS)
        self.standby_ramp: Layer = dict(STANDBY_RAMP_DEFAULTS)
        self.cacheable_routes: list[Located] = []  # every `cacheable_routes` written
        self.groups: dict[str, OriginGroup | None] = {}
        self.unsure_pops: set[str] = set()  # a bad address or offset: skip their port checks
        self.broken: set[str] = set()  # sections that are not mappings: skip references to them

    def named_entries(self, fields: Fields, what: str) -> Iterable[tuple[Named, yaml.Node]]:
        """Entries of a mapping keyed by names; bad names are reported and skipped."""
        for key, value in fields.items():
            entry_path = join(fields.path, str(key.value))
            try:
                check_name(str(key.value), what)
            except Bad as bad:
                self.sink.add(At.of(key, fields.path), str(bad))
                continue
            yield Named(str(key.value), At.of(value, entry_path)), value

    def list_of(self, parent: Fields, key: str, what: str,
                required: bool = True) -> tuple[str, list[yaml.Node]]:
        """The path and items of the list under `key`; a missing key (when `required`), a
        non-list and an empty list are problems (`must list at least one <what>`)."""
        path = join(parent.path, key)
        node = parent.node_of(key)
        if required and parent.ok and node is None:
            self.sink.add(parent.at(), f"missing required key '{key}'")
        items = sequence(node, path, self.sink)
        if isinstance(node, yaml.SequenceNode) and not items:
            self.sink.add(At.of(node, path), f"must list at least one {what}")
        return path, items

    def unique_names(self, items: list[yaml.Node], path: str, what: str) -> list[
            tuple[Named | None, Fields]]:
        """List items that are mappings with a `name:`; duplicates are reported."""
        result: list[tuple[Named | None, Fields]] = []
        seen: dict[str, int] = {}
        for index, item in enumerate(items):
            fields = Fields(item, f"{path}[{index}]", self.sink)
            value = fields.read("name", name(what), required=True)
            named = Named(value, fields.at("name")) if value is not None else None
            if named is not None and named.name in seen:
                self.sink.add(named.at, f"duplicate {what} name '{named.name}' "
                              f"(first at line {seen[named.name]})")
            elif named is not None:
                seen[named.name] = named.at.line
            result.append((named, fields))
        return result

    def reference(self, fields: Fields, key: str, section: str, options: Iterable[str],
                  required: bool = True) -> str | None:
        """A name that must exist in `section` (unchecked when that section is broken)."""
        value = fields.read(key, text, required=required)
        choices = list(options)
        what = {"tiers": "tier", "origin_groups": "origin group"}[section]
        if value is not None and value not in choices and section not in self.broken:
            self.sink.add(fields.at(key),
                          f"unknown {what} '{value}'" + did_you_mean(value, choices))
            return None
        return value

    def note_broken(self, section: Fields) -> None:
        if not section.ok:
            self.broken.add(section.path)
