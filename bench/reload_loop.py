"""The event loop during a hot reload of a large desired state: `python -m bench.reload_loop`.

`ballast serve` (a process of its own, as in production: `freeze_heap`, the file watcher) serves
100 PoPs x 50 origin groups; one simulated delta node per PoP (in a second process, over real
gRPC: CDS, EDS, LDS, RDS) holds every resource. The edit changes one tier timeout of one group
(`g000`'s critical `read_timeout`), so every PoP's routes change and every node gets a push. This
process asks the admin API's `/healthz` every 10 ms from a thread and times each answer: the
worst answer during the reload (from SIGHUP until every node holds the new routes; the
`config_applied` record in the decision log marks the swap) is how long an operator's probe, or
any other callback, waited for the loop.

Several runs, each with a fresh server (`--reloads N`: N reloads each, the edit and back, with
the server's RSS after each); the report is the median and range of each figure.
`--debug` runs the server with asyncio's debug mode (`PYTHONASYNCIODEBUG=1`) and prints the
callbacks it logged as slow (over 50 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import proc_rss_bytes
from control_plane.translate.resources import ROUTE_TYPE
from harness.ads_desired import fleet_yaml
from harness.envoy_process import free_port
from harness.eventually import eventually_blocking
from harness.loop_probes import HealthzProbe
from harness.xds_client import XdsClient, connect, local_channel, make_node

POPS, GROUPS = 100, 50
EDITED = "    tiers: {critical: {read_timeout: 3s}}\n"


def edited(text: str) -> str:
    """`text` with g000's critical read timeout set to 3 s (its routes change in every PoP)."""
    head, _, tail = text.partition("  g000:\n")
    return f"{head}  g000:\n{EDITED}{tail}"


class Records:
    """The decision log's records by kind, read as it grows (only the new bytes each time)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "decisions.jsonl"
        self.kinds: dict[str, int] = {}
        self._offset = 0

    def count(self, kind: str) -> int:
        if self.path.exists():
            with self.path.open("rb") as log:
                log.seek(self._offset)
                data = log.read()
            complete = data[:data.rfind(b"\n") + 1]
            self._offset += len(complete)
            for line in complete.splitlines():
                name = json.loads(line).get("kind")
                self.kinds[name] = self.kinds.get(name, 0) + 1
        return self.kinds.get(kind, 0)


async def _nodes(port: int, pops: int) -> None:
    """The node process: one delta node per PoP; prints `synced` once each holds its
    resources; for each `expect` line on stdin, `pushed` once every node holds new routes;
    holds the streams until stdin closes."""
    channels, clients = [], []
    for p in range(pops):
        channel = local_channel(f"127.0.0.1:{port}")
        client = XdsClient(channel, make_node(f"n{p:03d}", f"p{p:03d}"), delta=True)
        channels.append(channel)
        clients.append(client)
    await asyncio.gather(*(connect(client, 300) for client in clients))
    print("synced", flush=True)

    def routes() -> list[str]:
        return [client.state.resources[ROUTE_TYPE]["edge"][0] for client in clients]

    while await asyncio.to_thread(sys.stdin.readline) == "expect\n":  # a reload comes
        before = routes()
        await asyncio.gather(*(client.wait_for(
            lambda c, v=v: c.state.resources[ROUTE_TYPE]["edge"][0] != v, 600)
            for client, v in zip(clients, before, strict=True)))
        print("pushed", flush=True)  # every node holds the new routes
    for client, channel in zip(clients, channels, strict=True):
        await client.close()
        await channel.close()


def one_run(debug: bool, count: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ballast-reload-loop-") as tmp:
        root = Path(tmp)
        desired, state = root / "desired.yaml", root / "state"
        # every PoP at once (no waves): the bench measures one reload, not a staged rollout
        text = fleet_yaml(pops=POPS, groups=GROUPS) + "rollout: {strategy: immediate}\n"
        desired.write_text(text)
        xds, admin = free_port(), free_port()
        env = {**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "false"}
        if debug:
            env["PYTHONASYNCIODEBUG"] = "1"
        log = (root / "serve.log").open("w")
        started = time.perf_counter()
        server = subprocess.Popen(
            [sys.executable, "-m", "control_plane", "serve", str(desired), "--state-dir",
             str(state), "--xds-address", f"127.0.0.1:{xds}", "--admin-address",
             f"127.0.0.1:{admin}", "--no-probes", "--reconcile-interval", "3600s"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        nodes = None
        try:
            url = f"http://127.0.0.1:{admin}"

            def ready() -> bool:
                if server.poll() is not None:
                    raise RuntimeError(f"ballast serve exited: {(root / 'serve.log').read_text()}")
                try:
                    with urllib.request.urlopen(f"{url}/readyz", timeout=5) as answer:
                        return bool(answer.status == 200)
                except OSError:
                    return False

            eventually_blocking(ready, 600, "ballast serve ready")
            start_up = time.perf_counter() - started
            nodes = subprocess.Popen(
                [sys.executable, "-m", "bench.reload_loop", "--nodes-for", str(xds)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                start_new_session=True)
            assert nodes.stdout is not None and nodes.stdin is not None
            assert nodes.stdout.readline().strip() == "synced", "the nodes did not sync"
            records = Records(state)
            # the first tick (a hold for every pair) is over before anything is measured
            eventually_blocking(lambda: records.count("hold") >= POPS * GROUPS, 600,
                                "the first tick's hold records")
            probe = HealthzProbe(f"{url}/healthz")
            probe.start()
            time.sleep(1)  # answers before the reload: the quiet baseline
            quiet = probe.worst()
            reloads = []
            for n in range(count):  # edited, back, edited, ...
                applied = records.count("config_applied")
                desired.write_text(edited(text) if n % 2 == 0 else text)
                nodes.stdin.write("expect\n")
                nodes.stdin.flush()
                started = time.perf_counter()
                server.send_signal(signal.SIGHUP)
                eventually_blocking(lambda a=applied: records.count("config_applied") > a, 600,
                                    "the reload's config_applied record", interval=0.02)
                recorded = time.perf_counter()
                assert nodes.stdout.readline().strip() == "pushed", "the push did not arrive"
                ended = time.perf_counter()
                reloads.append({"reload_s": recorded - started, "pushed_s": ended - started,
                                "worst_healthz_ms": probe.worst(started, ended) * 1000,
                                "worst_after_swap_ms": probe.worst(recorded, ended) * 1000,
                                "answers_during": float(probe.during(started, ended)),
                                "rss_mb": proc_rss_bytes(server.pid) / 2**20})
            probe.stop()
            return {
                "start_up_s": start_up,
                "quiet_worst_healthz_ms": quiet * 1000,
                "reloads": reloads,
                "slow_callbacks": [line for line in (root / "serve.log").read_text()
                                   .splitlines() if "Executing" in line and "took" in line],
            }
        finally:
            if nodes is not None:
                nodes.communicate(timeout=60)
            server.send_signal(signal.SIGTERM)
            server.wait(60)
            log.close()


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.1f} [{min(values):,.1f}-{max(values):,.1f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reload_loop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="servers, one after the other")
    parser.add_argument("--reloads", type=int, default=1,
                        help="reloads per server: the edit, then back, and so on")
    parser.add_argument("--debug", action="store_true",
                        help="asyncio debug mode in the server; print its slow callbacks")
    parser.add_argument("--nodes-for", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.nodes_for:
        asyncio.run(_nodes(args.nodes_for, POPS))
        return 0
    reloads: list[dict[str, float]] = []
    for n in range(args.runs):
        result = one_run(args.debug, args.reloads)
        print(f"run {n + 1}: start-up {result['start_up_s']:.1f} s, worst /healthz before the "
              f"reloads {result['quiet_worst_healthz_ms']:.0f} ms, load "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        for k, one in enumerate(result["reloads"], 1):
            print(f"  reload {k}: {one['reload_s']:.2f} s (every node has it after "
                  f"{one['pushed_s']:.2f} s), worst /healthz "
                  f"{one['worst_healthz_ms']:.0f} ms ({one['answers_during']:.0f} answers; after "
                  f"config_applied {one['worst_after_swap_ms']:.0f} ms), "
                  f"server RSS after it {one['rss_mb']:.0f} MB", flush=True)
        reloads += result["reloads"]
        for line in result["slow_callbacks"]:
            print("   ", line[:200], "...", line[line.rfind("took"):])
    print(f"{POPS} PoPs x {GROUPS} groups, {args.runs} runs x {args.reloads} reloads: reload "
          f"{spread([r['reload_s'] for r in reloads])} s, every node has it after "
          f"{spread([r['pushed_s'] for r in reloads])} s, worst /healthz until then "
          f"{spread([r['worst_healthz_ms'] for r in reloads])} ms (after config_applied "
          f"{spread([r['worst_after_swap_ms'] for r in reloads])} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
