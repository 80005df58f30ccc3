"""Typed JSON: an Envoy protobuf message written as JSON with its `@type` (the protobuf JSON
mapping of `google.protobuf.Any`), checked against the message types xds-protos knows.

`typed_config(value)` returns the type URL and the message's wire bytes, or raises `Bad` with
what is wrong (an unknown `@type` anywhere in it, a field the message does not have, a value of
the wrong kind). The modules of a type's package are imported on first use, so every `@type`
nested inside (a compressor's library, say) resolves too.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from typing import Any

from google.protobuf import any_pb2, json_format, symbol_database

from control_plane.desired.fields import Bad

TYPE_PREFIX = "type.googleapis.com/"
MAX_TYPE_CHARS = 200
_IMPORTED: set[str] = set()


def _types_in(value: object) -> Iterator[str]:
    if isinstance(value, dict):
        found = value.get("@type")
        if isinstance(found, str):
            yield found
        for item in value.values():
            yield from _types_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from _types_in(item)


def _import_package(type_name: str) -> None:
    """Import every `_pb2` module of the message's package (its descriptors join the pool).
    The package is noted as done only once all of them are in: a parse on another thread
    meanwhile (two replicas in one process, a reload beside `validate`) imports them too, each
    module waiting on Python's import lock, instead of looking its type up half-imported."""
    package = type_name.rsplit(".", 1)[0]
    if package in _IMPORTED or not package.startswith(("envoy.", "xds.", "udpa.", "google.")):
        return
    try:
        module = importlib.import_module(package)
    except ImportError:
        _IMPORTED.add(package)
        return
    for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
        if info.name.endswith("_pb2"):
            importlib.import_module(f"{package}.{info.name}")
    _IMPORTED.add(package)


def known_type(type_name: str) -> bool:
    _import_package(type_name)
    try:
        symbol_database.Default().GetSymbol(type_name)
    except KeyError:
        return False
    return True


def typed_config(value: Any) -> tuple[str, bytes]:
    """(type URL, wire bytes) of a typed JSON mapping; `Bad` when it is not one Envoy has."""
    if not isinstance(value, dict) or not isinstance(value.get("@type"), str):
        raise Bad("must be a mapping with '@type: type.googleapis.com/<Envoy message>' and the "
                  "message's fields")
    for type_url in _types_in(value):
        if len(type_url) > MAX_TYPE_CHARS or not type_url.startswith(TYPE_PREFIX):
            raise Bad(f"'@type' must look like {TYPE_PREFIX}<message>, got {type_url[:80]!r}")
        name = type_url[len(TYPE_PREFIX):]
        if not known_type(name):
            raise Bad(f"unknown filter type {type_url!r}: no such Envoy message")
    packed = any_pb2.Any()
    try:
        json_format.ParseDict(value, packed)
    except (json_format.ParseError, TypeError, ValueError) as err:
        raise Bad(f"{value['@type']}: {str(err)[:300]}") from None
    return packed.type_url, packed.value

