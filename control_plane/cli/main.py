"""`ballast` command line: one module per sub-command, imported only when it runs.

Each command module exposes `HELP: str`, `add_arguments(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from types import ModuleType

COMMANDS: dict[str, str] = {
    "init": "control_plane.cli.init",
    "validate": "control_plane.cli.validate",
    "render": "control_plane.cli.render",
    "bootstrap": "control_plane.cli.bootstrap",
    "certs": "control_plane.cli.certs",
    "serve": "control_plane.cli.serve",
    "decisions": "control_plane.cli.decisions",
    "explain": "control_plane.cli.explain",
    "plan": "control_plane.cli.plan",
    "status": "control_plane.cli.status",
    "rollout": "control_plane.cli.rollout",
    "prometheus-config": "control_plane.cli.prometheus_config",
}


def _load(name: str) -> ModuleType:
    return importlib.import_module(COMMANDS[name])


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ballast", description="xDS control plane for Envoy fleets"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        if only is not None and name != only:
            sub.add_parser(name)
            continue
        module = _load(name)
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    first = next((a for a in args_in if not a.startswith("-")), None)
    if first == "serve":
        # gRPC core logs every failed TLS handshake on the xDS port at INFO, unauthenticated
        # (300 lines in 2.2 s from one scanner): ERROR and up unless the operator asks for
        # more; read once, when grpc is imported, which loading the command does
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    parser = build_parser(first if first in COMMANDS else None)
    args = parser.parse_args(args_in)
    return int(_load(args.command).run(args))


if __name__ == "__main__":
    sys.exit(main())
