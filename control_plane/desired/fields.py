"""Typed reading of YAML nodes: converters for each kind of value, and a mapping reader.

A converter turns one node into a Python value or raises `Bad` with what was expected and what
was found. `Fields` reads the keys of one mapping with converters, records every problem at the
value's line and column, and at the end reports the keys nobody asked for, with a did-you-mean.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import ipaddress
import math
import re
from collections.abc import Callable, Iterator
from typing import TypeVar

import yaml

from control_plane.desired.errors import At, Sink
from control_plane.desired.yaml_nodes import describe, join, scalar

T = TypeVar("T")
Converter = Callable[[yaml.Node], T]

NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
HOSTNAME_RE = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                         r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
HEADER_RE = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")
DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
MAX_DURATION_MS = 86_400_000
MAX_PATH_CHARS = 4096
SHA256_BYTES = 32
HEX_SHA256_RE = re.compile(r"[0-9a-f]{64}")


class Bad(Exception):
    """A value that does not fit; the message says what was expected and what was found."""


def _scalar_of(node: yaml.Node, expected: str) -> object:
    if not isinstance(node, yaml.ScalarNode):
        raise Bad(f"must be {expected}, got {describe(node)}")
    return scalar(node)


def _in_range(value: int | float, low: float, high: float, shown: str) -> None:
    if not low <= value <= high:
        raise Bad(f"must be between {_num(low)} and {_num(high)}, got {shown}")


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def integer(low: int, high: int) -> Converter[int]:
    def convert(node: yaml.Node) -> int:
        value = _scalar_of(node, "an integer")
        if not isinstance(value, int) or isinstance(value, bool):
            raise Bad(f"must be an integer, got {describe(node)}")
        _in_range(value, low, high, node.value)
        return value

    return convert


def percent(low: int, high: int) -> Converter[int]:
    """Whole percent points, written `5` or `'5%'`."""

    def convert(node: yaml.Node) -> int:
        value = _scalar_of(node, "a whole percentage like 5 or 5%")
        if isinstance(value, str) and re.fullmatch(r"\d+%", value.strip()):
            value = int(value.strip()[:-1])
        if not isinstance(value, int) or isinstance(value, bool):
            raise Bad(f"must be a whole percentage like 5 or 5%, got {describe(node)}")
        _in_range(value, low, high, str(node.value))
        return value

    return convert


def fraction(low: float, high: float) -> Converter[float]:
    """A ratio written `0.02` or `'2%'`; returned as a fraction (0.02)."""

    def convert(node: yaml.Node) -> float:
        expected = "a fraction like 0.02 or a percentage like 2%"
        value = _scalar_of(node, expected)
        if isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?%", value.strip()):
            value = float(value.strip()[:-1]) / 100
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise Bad(f"must be {expected}, got {describe(node)}")
        _in_range(value, low, high, node.value)
        return float(value)

    return convert


def number(low: float, high: float) -> Converter[float]:
    def convert(node: yaml.Node) -> float:
        value = _scalar_of(node, "a number")
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise Bad(f"must be a number, got {describe(node)}")
        _in_range(value, low, high, node.value)
        return float(value)

    return convert


def duration(low_ms: int = 1, high_ms: int = MAX_DURATION_MS) -> Converter[int]:
    """`800ms`, `2s`, `1.5s`, `1m`, `1h` to integer milliseconds."""

    def convert(node: yaml.Node) -> int:
        expected = "a duration like 800ms, 2s, 1.5s or 1m"
        value = _scalar_of(node, expected)
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise Bad(f"must be {expected} (with a unit), got {node.value} (no unit)")
        match = DURATION_RE.fullmatch(value.strip()) if isinstance(value, str) else None
        if match is None:
            raise Bad(f"must be {expected}, got {describe(node)}")
        millis = float(match.group(1)) * UNIT_MS[match.group(2)]
        if not millis.is_integer():
            raise Bad(f"must be a whole number of milliseconds, got {node.value!r}")
        if not low_ms <= millis <= high_ms:
            raise Bad(f"must be between {_ms(low_ms)} and {_ms(high_ms)}, got {node.value}")
        return int(millis)

    return convert


def _ms(millis: int) -> str:
    for unit in ("h", "m", "s"):
        if millis % UNIT_MS[unit] == 0:
            return f"{millis // UNIT_MS[unit]}{unit}"
    return f"{millis}ms"


def boolean(node: yaml.Node) -> bool:
    value = _scalar_of(node, "true or false")
    if not isinstance(value, bool):
        raise Bad(f"must be true or false, got {describe(node)}")
    return value


def text(node: yaml.Node) -> str:
    value = _scalar_of(node, "a string")
    if not isinstance(value, str):
        raise Bad(f"must be a string, got {describe(node)}")
    if not value.strip():
        raise Bad("must not be empty")
    return value


def path_prefix(node: yaml.Node) -> str:
    value = text(node)
    if not value.startswith("/") or any(c.isspace() for c in value):
        raise Bad(f"must be a URL path starting with '/' and without spaces, got {value!r}")
    return value


def choice(*options: str) -> Converter[str]:
    def convert(node: yaml.Node) -> str:
        value = _scalar_of(node, f"one of {', '.join(options)}")
        if value not in options:
            raise Bad(f"must be one of {', '.join(options)}, got {describe(node)}"
                      + did_you_mean(str(value), options))
        return str(value)

    return convert


def check_name(value: str, what: str) -> None:
    """Names become Envoy locality zones and stat name parts."""
    if not NAME_RE.fullmatch(value):
        raise Bad(f"invalid {what} name {value!r}: use lower-case letters, digits, '-' and '_' "
                  "(no dots), starting with a letter or digit, at most 63 characters")


def name(what: str) -> Converter[str]:
    def convert(node: yaml.Node) -> str:
        if not isinstance(node, yaml.ScalarNode):
            raise Bad(f"must be a {what} name, got {describe(node)}")
        check_name(str(node.value), what)
        return str(node.value)

    return convert


def ip_address(node: yaml.Node) -> str:
    value = text(node)
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise Bad(f"must be an IP address like 127.0.0.1 or ::, got {value!r}") from None
    return value


def network(node: yaml.Node) -> str:
    """An IP network like 10.0.0.0/8 or a single address (kept as /32 or /128)."""
    value = text(node).strip()
    try:
        return str(ipaddress.ip_network(value, strict=True))
    except ValueError:
        raise Bad(f"must be an IP network like 10.1.0.0/16 or an address, with no host bits "
                  f"set after the prefix, got {value!r}") from None


def host(node: yaml.Node) -> str:
    value = text(node)
    try:
        ipaddress.ip_address(value)
    except ValueError:
        if not HOSTNAME_RE.fullmatch(value):
            raise Bad(f"must be an IP address or a DNS name, got {value!r}") from None
    return value


def file_path(node: yaml.Node) -> str:
    """An absolute file path on the Envoy hosts (no check that it exists here)."""
    value = text(node)
    if not value.startswith("/") or len(value) > MAX_PATH_CHARS or "\0" in value:
        raise Bad(f"must be an absolute file path (at most {MAX_PATH_CHARS} characters), "
                  f"got {value!r}")
    return value


def spki_pin(node: yaml.Node) -> str:
    """Base64 of a certificate's SHA-256 SPKI hash (Envoy's verify_certificate_spki)."""
    value = text(node).strip()
    try:
        raw = base64.b64decode(value, validate=True)
    except (ValueError, binascii.Error):
        raw = b""
    if len(raw) != SHA256_BYTES:
        raise Bad(f"must be the base64 of a SHA-256 SPKI hash (44 characters), got {value!r}")
    return value


def cert_pin(node: yaml.Node) -> str:
    """Hex of a certificate's SHA-256 hash, colons allowed; kept lower-case without colons."""
    value = text(node).strip().replace(":", "").lower()
    if not HEX_SHA256_RE.fullmatch(value):
        raise Bad(f"must be the hex SHA-256 hash of a certificate (64 hex digits, colons "
                  f"allowed), got {text(node)!r}")
    return value


def header_name(node: yaml.Node) -> str:
    value = text(node)
    if not HEADER_RE.fullmatch(value):
        raise Bad(f"must be an HTTP header name, got {value!r}")
    return value.lower()


def cookie_name(node: yaml.Node) -> str:
    """A cookie name: an HTTP token (RFC 6265), case kept."""
    value = text(node)
    if not HEADER_RE.fullmatch(value):
        raise Bad(f"must be a cookie name (an HTTP token), got {value!r}")
    return value


def did_you_mean(word: str, options: tuple[str, ...] | list[str] | set[str]) -> str:
    close = difflib.get_close_matches(word, sorted(options), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


class Fields:
    """The keys of one YAML mapping at `path`, read one by one with converters.

    Reading a key that holds a bad value records a problem and returns None, so callers skip
    the checks that would need it. `finish()` reports the keys that were never read.
    """

    def __init__(self, node: yaml.Node | None, path: str, sink: Sink, what: str = "") -> None:
        self.node = node
        self.path = path
        self.sink = sink
        self.ok = isinstance(node, yaml.MappingNode)
        self.entries: dict[str, tuple[yaml.ScalarNode, yaml.Node]] = {}
        self.known: set[str] = set()
        if node is not None and not self.ok:
            sink.add(At.of(node, path), f"must be a mapping{what}, got {describe(node)}")
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    self.entries.setdefault(str(key.value), (key, value))

    def at(self, key: str | None = None) -> At:
        """Where a key's value was written, or the mapping itself for a missing key."""
        if key is not None and key in self.entries:
            return At.of(self.entries[key][1], join(self.path, key))
        if self.node is None:
            return At(1, 1, self.path)
        return At.of(self.node, self.path)

    def has(self, key: str) -> bool:
        """Whether the key was written; asking makes it a known key of this mapping."""
        self.known.add(key)
        return key in self.entries

    def node_of(self, key: str) -> yaml.Node | None:
        self.known.add(key)
        entry = self.entries.get(key)
        return entry[1] if entry else None

    def read(self, key: str, convert: Converter[T], required: bool = False) -> T | None:
        node = self.node_of(key)
        if node is None:
            if required and self.ok:
                self.sink.add(self.at(), f"missing required key '{key}'")
            return None
        return self.convert(node, join(self.path, key), convert)

    def convert(self, node: yaml.Node, path: str, convert: Converter[T]) -> T | None:
        try:
            return convert(node)
        except Bad as bad:
            self.sink.add(At.of(node, path), str(bad))
            return None

    def items(self) -> Iterator[tuple[yaml.ScalarNode, yaml.Node]]:
        """Every entry, for mappings keyed by names (pops, origins, ...)."""
        self.known.update(self.entries)
        yield from self.entries.values()

    def finish(self) -> None:
        for key, (key_node, _) in self.entries.items():
            if key not in self.known:
                self.sink.add(At.of(key_node, self.path),
                              f"unknown key '{key}'" + did_you_mean(key, self.known))


def sequence(node: yaml.Node | None, path: str, sink: Sink) -> list[yaml.Node]:
    """The items of a list node; anything else is a problem and reads as an empty list."""
    if node is None:
        return []
    if not isinstance(node, yaml.SequenceNode):
        sink.add(At.of(node, path), f"must be a list, got {describe(node)}")
        return []
    return list(node.value)
