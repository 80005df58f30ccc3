"""`ballast serve FILE`: serve the desired state over ADS until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from control_plane.app.server import BallastServer
from control_plane.desired import DesiredStateError, load_desired

HELP = "serve the desired state to Envoys over ADS (gRPC, SotW and delta)"
SHUTDOWN_GRACE = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="desired-state YAML")
    parser.add_argument(
        "--xds-address",
        default="127.0.0.1:18000",
        metavar="HOST:PORT",
        help="where Envoys connect (default 127.0.0.1:18000)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level (default info)",
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        desired = load_desired(args.file)
    except DesiredStateError as err:
        print(err, file=sys.stderr)
        return 1
    return asyncio.run(_serve(BallastServer(desired, xds_address=args.xds_address)))


async def _serve(server: BallastServer) -> int:
    try:
        await server.start()
    except (OSError, RuntimeError) as err:
        print(f"ballast serve: cannot listen on {server.xds_address}: {err}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"ballast: serving xDS on {server.xds_address.rsplit(':', 1)[0]}:{server.port}",
          file=sys.stderr, flush=True)
    await stop.wait()
    logging.getLogger(__name__).info("shutting down: closing streams")
    await server.stop(SHUTDOWN_GRACE)
    return 0
