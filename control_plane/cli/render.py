"""`ballast render FILE --pop NAME`: print exactly what a PoP's Envoys (or, with --grpc-client,
its proxyless gRPC clients) will get, as JSON."""

from __future__ import annotations

import argparse
import json
import sys

from control_plane.cli.translate_options import (
    DEFAULT_ENVOY_RELEASE,
    OptionError,
    add_filter_option,
    filters_of,
    load_or_report,
    node_capabilities,
    parse_weights,
    release_capabilities,
)
from control_plane.translate import (
    ENVOY_RELEASES,
    PopIntent,
    UnknownPop,
    WeightsError,
    render_json,
    translate_pop,
)
from control_plane.translate.grpc_capabilities import FEATURES
from control_plane.translate.resources import Capabilities

HELP = "print a PoP's Envoy (or gRPC client) resources (protobuf JSON mapping)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_filter_option(parser)
    parser.add_argument("file", metavar="FILE", help="desired-state YAML")
    parser.add_argument("--pop", required=True, metavar="NAME", help="the PoP to render")
    target = parser.add_mutually_exclusive_group()
    target.add_argument(
        "--envoy-version",
        default=DEFAULT_ENVOY_RELEASE,
        metavar="X.Y",
        help=f"render for this Envoy release's extensions ({', '.join(ENVOY_RELEASES)}; "
        f"default {DEFAULT_ENVOY_RELEASE})",
    )
    target.add_argument(
        "--extensions-from-node",
        metavar="FILE",
        help="render for the extensions of this Envoy node (protobuf JSON of a Node; a gRPC "
        "client's node: what that client's release gets)",
    )
    target.add_argument(
        "--grpc-client", action="store_true",
        help="render what a proxyless gRPC client of a current release gets: the gRPC services",
    )
    parser.add_argument(
        "--weights",
        metavar="GROUP.ORIGIN=W,...",
        help="origin weights for this PoP, summing to 100 per group "
        "(default: the PoP's starting weights)",
    )


def run(args: argparse.Namespace) -> int:
    desired = load_or_report(args.file, filters_of(args))
    if desired is None:
        return 1
    try:
        caps = (
            node_capabilities(args.extensions_from_node)
            if args.extensions_from_node
            else Capabilities(grpc=frozenset(FEATURES)) if args.grpc_client
            else release_capabilities(args.envoy_version)
        )
        weights = parse_weights(args.weights) if args.weights else {}
        resources = translate_pop(desired, args.pop, caps, PopIntent(weights=weights))
    except OptionError as err:
        print(f"ballast render: {err}", file=sys.stderr)
        return 2
    except WeightsError as err:
        print(f"ballast render: --weights: {err}", file=sys.stderr)
        return 2
    except UnknownPop as err:
        print(f"ballast render: --pop: {err.args[0]}", file=sys.stderr)
        return 2
    for note in resources.notes:
        print(f"note: {note}", file=sys.stderr)
    print(json.dumps(render_json(resources), indent=2))
    return 0
