"""The origins' host of the multi-host test, run in its network namespace: the demo origins
`primary` and `secondary` on ADDRESS:8081/8082 (faults switched by `POST /_ballast/fault`) and
steady traffic through every edge (`--edge POP=URL`), each answer appended to OUT as
`<unix time> <pop> <status>` (0: the request failed). Runs until SIGTERM.

    python -m tests.support.hosts_origins ADDRESS OUT --edge ewr=http://198.18.0.21:10000 ...
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from harness.demo_origin import DemoOrigin
from harness.traffic import steady_traffic, stop_tasks

ORIGIN_PORTS = {"primary": 8081, "secondary": 8082}
RPS = 20.0


def _recorder(out: TextIO, pop: str) -> Callable[[int], None]:
    def record(status: int) -> None:
        out.write(f"{time.time():.3f} {pop} {status}\n")
        out.flush()
    return record


async def _run(address: str, out_path: Path, edges: dict[str, str]) -> None:
    origins = [await DemoOrigin(name, port, host=address).start()
               for name, port in ORIGIN_PORTS.items()]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    with out_path.open("a") as out:
        tasks = [asyncio.create_task(steady_traffic(url, ("/api/checkout",), RPS, stop,
                                                    _recorder(out, pop)))
                 for pop, url in edges.items()]
        await stop.wait()
        await stop_tasks(stop, tasks)
    for origin in origins:
        await origin.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("out", type=Path)
    parser.add_argument("--edge", action="append", default=[], metavar="POP=URL")
    args = parser.parse_args()
    edges = dict(edge.split("=", 1) for edge in args.edge)
    asyncio.run(_run(args.address, args.out, edges))


if __name__ == "__main__":
    main()
