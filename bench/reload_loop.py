"""The event loop during a hot reload of a large desired state: `python -m bench.reload_loop`.

`ballast serve` (a process of its own, as in production: `freeze_heap`, the file watcher) serves
100 PoPs x 50 origin groups; one simulated delta node per PoP (in a second process, over real
gRPC: CDS, EDS, LDS, RDS) holds every resource. The edit changes one tier timeout of one group
(`g000`'s critical `read_timeout`), so every PoP's routes change and every node gets a push. This
process asks the admin API's `/healthz` every 10 ms from a thread and times each answer: the
worst answer during the reload (SIGHUP to the `config_applied` record in the decision log) is
how long an operator's probe, or any other callback, waited for the loop.

Several runs, each with a fresh server; the report is the median and range of each figure.
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
    resources, then holds the streams until stdin closes."""
    channels, clients = [], []
    for p in range(pops):
        channel = local_channel(f"127.0.0.1:{port}")
        client = XdsClient(channel, make_node(f"n{p:03d}", f"p{p:03d}"), delta=True)
        channels.append(channel)
        clients.append(client)
    await asyncio.gather(*(connect(client, 300) for client in clients))
    print("synced", flush=True)
    await asyncio.to_thread(sys.stdin.read)
    for client, channel in zip(clients, channels, strict=True):
        await client.close()
        await channel.close()


def one_run(debug: bool) -> dict[str, float | list[str]]:
    with tempfile.TemporaryDirectory(prefix="ballast-reload-loop-") as tmp:
        root = Path(tmp)
        desired, state = root / "desired.yaml", root / "state"
        text = fleet_yaml(pops=POPS, groups=GROUPS)
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
            assert nodes.stdout is not None
            assert nodes.stdout.readline().strip() == "synced", "the nodes did not sync"
            records = Records(state)
            # the first tick (a hold for every pair) is over before anything is measured
            eventually_blocking(lambda: records.count("hold") >= POPS * GROUPS, 600,
                                "the first tick's hold records")
            applied = records.count("config_applied")
            probe = HealthzProbe(f"{url}/healthz")
            probe.start()
            time.sleep(1)  # answers before the reload: the quiet baseline
            desired.write_text(edited(text))
            reload_started = time.perf_counter()
            server.send_signal(signal.SIGHUP)
            eventually_blocking(lambda: records.count("config_applied") > applied, 600,
                                "the reload's config_applied record", interval=0.02)
            reload_s = time.perf_counter() - reload_started
            probe.stop()
            before = [took for asked, took in probe.answers if asked < reload_started - 0.05]
            return {
                "start_up_s": start_up,
                "reload_s": reload_s,
                "worst_healthz_ms": probe.worst(reload_started, reload_started + reload_s)
                * 1000,
                "quiet_worst_healthz_ms": max(before) * 1000,
                "answers_during": float(probe.during(reload_started, reload_started + reload_s)),
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
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--debug", action="store_true",
                        help="asyncio debug mode in the server; print its slow callbacks")
    parser.add_argument("--nodes-for", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.nodes_for:
        asyncio.run(_nodes(args.nodes_for, POPS))
        return 0
    runs = []
    for n in range(args.runs):
        result = one_run(args.debug)
        runs.append(result)
        print(f"run {n + 1}: start-up {result['start_up_s']:.1f} s, reload "
              f"{result['reload_s']:.2f} s, worst /healthz {result['worst_healthz_ms']:.0f} ms "
              f"({result['answers_during']:.0f} answers; before the reload: worst "
              f"{result['quiet_worst_healthz_ms']:.0f} ms), load {os.getloadavg()[0]:.1f}",
              flush=True)
        for line in result["slow_callbacks"]:  # type: ignore[union-attr]
            print("   ", line[:300])
    print(f"{POPS} PoPs x {GROUPS} groups, {args.runs} runs: reload "
          f"{spread([r['reload_s'] for r in runs])} s, worst /healthz during it "  # type: ignore[misc]
          f"{spread([r['worst_healthz_ms'] for r in runs])} ms")  # type: ignore[misc]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
