"""Replicas as the way past one core: N `ballast serve` replicas on one etcd, a fleet of simulated
nodes spread over them as an L4 balancer in front of the xDS port would.

`python -m bench.replicas [--nodes 10000] [--pops 100] [--groups 20] [--replicas 1,2]
[--runs 3]` (also `python -m bench.run --only replicas`). Per run, for each N in turn (runs
interleave the Ns, so each N sees about the same load):

1. a fresh etcd (`harness/etcd.py`) and N replicas (`bench/replica_server.py`: a real
   `BallastService` with `--store etcd://...`), until one leads;
2. `CLIENT_PROCESSES` processes of simulated nodes (`bench/replica_nodes.py`, `harness/
   lean_node.py`: a node costs ~1.3 ms of CPU in a storm, the `XdsClient` of the fleet bench
   2.8 ms), node i in PoP i mod P, 10 nodes a TCP connection, connection c to replica c mod N;
3. **storm**: every node does its start-up exchange, 500 at a time; time until the last is
   synced; each replica's CPU and the nodes' CPU per node;
4. **one-PoP change** (`PUSHES`, PoPs p000..p004 in turn) and **global change** (twice): the
   leader changes g000's weights through the change transaction, as a tick does; the other
   replicas adopt it from etcd. Push (the leader's swap) -> the last ACK of the new EDS version
   by every node of those PoPs, whichever replica it is on. The version the leader serves is
   what every node must reach: a replica serving another would never get there;
5. **every node's config equal**: per PoP, each node's (version, digest of the resources) of
   every type; one config per PoP across all replicas;
6. with N >= 2, **a replica dies**: the leader is killed (SIGKILL); its nodes' streams end, each
   reconnects after a jittered back-off of up to 1 s to the next replica (a dead one refuses
   the connection): time from the kill until every node is synced again, and the config check
   again (the replica that took them over serves what the dead one did).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.command_pipe import ServerProcess
from bench.common import ROOT, median, table
from bench.fleet import spread
from harness.ads_desired import fleet_yaml
from harness.etcd import EtcdServer

CLIENT_PROCESSES = 2
PER_CONNECTION = 10
CONNECTING = 500
PUSHES = 10
TIMEOUT_S = 300.0


async def call_all(processes: list[ServerProcess], **command: Any) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(p.call(**command) for p in processes)))


async def one(replicas: int, nodes: int, pops: int, groups: int, folder: Path
              ) -> dict[str, Any]:
    out: dict[str, Any] = {"replicas": replicas, "nodes": nodes, "errors": [], "deposed": 0,
                           "loadavg": [os.getloadavg()[0]]}
    etcd = EtcdServer().start()
    desired = folder / "desired.yaml"
    desired.write_text(fleet_yaml(pops=pops, groups=groups, rollout="immediate"))
    servers: list[ServerProcess] = []
    clients: list[ServerProcess] = []
    try:
        servers = [ServerProcess([sys.executable, "-m", "bench.replica_server", str(desired),
                                  str(folder / f"r{i}"), etcd.url, f"r{i}"], stop_wait_s=20)
                   for i in range(replicas)]
        await _leader(servers)
        ports = ",".join(str(server.port) for server in servers)
        share = -(-nodes // CLIENT_PROCESSES)
        clients = [ServerProcess([sys.executable, "-m", "bench.replica_nodes", str(first),
                                  str(min(share, nodes - first)), str(pops),
                                  str(PER_CONNECTION), ports], stop_wait_s=20)
                   for first in range(0, nodes, share)]
        cpu0 = [server.cpu() for server in servers]
        start = time.monotonic()
        storm = await call_all(clients, cmd="storm", concurrency=CONNECTING // len(clients),
                               timeout=TIMEOUT_S)
        out["storm_s"] = max(result["synced_at"] for result in storm) - start
        out["storm_server_cpu_per_node_us"] = [
            (server.cpu() - before) * 1e6 / nodes for server, before in zip(servers, cpu0,
                                                                              strict=True)]
        out["storm_client_cpu_per_node_us"] = sum(r["cpu"] for r in storm) * 1e6 / nodes
        synced = sum(result["synced"] for result in storm)
        if synced != nodes:
            out["errors"].append(f"storm: {synced} of {nodes} synced, e.g. "
                                 f"{[e for r in storm for e in r['errors']][:2]}")
        statuses = await call_all(servers, cmd="status")
        out["nodes_per_replica"] = [status["nodes"] for status in statuses]
        out["one_pop_s"] = [await _push(servers, clients, [f"p{n % min(pops, 5):03d}"], n + 1,
                                        out) for n in range(PUSHES)]
        cpu0 = [server.cpu() for server in servers]
        out["global_s"] = [await _push(servers, clients, "*", PUSHES + n + 1, out)
                           for n in range(2)]
        out["global_server_cpu_per_node_us"] = [
            (server.cpu() - before) * 1e6 / (2 * nodes)
            for server, before in zip(servers, cpu0, strict=True)]
        out["configs_equal"] = await _configs_equal(clients, out)
        if replicas > 1:
            await _kill(servers, await _leader(servers), clients, out)
        out["loadavg"].append(os.getloadavg()[0])
    except Exception as err:  # a benchmark reports what went wrong and carries on
        out["errors"].append(f"{type(err).__name__}: {err}")
    finally:
        for process in (*clients, *servers):
            process.stop()
        etcd.cleanup()
    return out


async def _leader(servers: list[ServerProcess], timeout: float = 60.0) -> ServerProcess:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for server in servers:
            if (await server.call(cmd="status"))["leading"]:
                return server
        await asyncio.sleep(0.2)
    raise TimeoutError(f"no replica leads after {timeout:g} s")


async def _push(servers: list[ServerProcess], clients: list[ServerProcess],
                pops: list[str] | str, step: int, out: dict[str, Any]) -> float:
    """Push -> the last ACK; by the leader of the moment (a loaded machine can cost a leader
    its lease: that is counted in `deposed`, and the push made by the next)."""
    while "start" not in (pushed := await (await _leader(servers)).call(
            cmd="push", pops=pops, step=step)):
        out["deposed"] += 1
    watched = await call_all(clients, cmd="watch", versions=pushed["versions"],
                             timeout=TIMEOUT_S)
    behind = sum(result["behind"] for result in watched)
    if behind:
        out["errors"].append(f"push {step}: {behind} nodes never got the leader's version")
    return max(result["last_ack"] for result in watched) - pushed["start"]


async def _configs_equal(clients: list[ServerProcess], out: dict[str, Any]) -> bool:
    configs: dict[str, set[str]] = {}
    for held in await call_all(clients, cmd="config"):
        for pop, distinct in held.items():
            configs.setdefault(pop, set()).update(repr(config) for config in distinct)
    differ = sorted(pop for pop, distinct in configs.items() if len(distinct) != 1)
    if differ:
        out["errors"].append(f"nodes of {len(differ)} PoPs hold different configs, e.g. "
                             f"{differ[0]}: {sorted(configs[differ[0]])[:2]}")
    return not differ


async def _kill(servers: list[ServerProcess], leader: ServerProcess,
                clients: list[ServerProcess], out: dict[str, Any]) -> None:
    """The leader dies: its nodes move to the others."""
    killed = time.monotonic()
    os.killpg(leader.pid, signal.SIGKILL)
    leader.proc.wait()
    results = await call_all(clients, cmd="resync", dead=servers.index(leader), since=killed,
                             timeout=TIMEOUT_S)
    out["failover_moved"] = sum(result["affected"] for result in results)
    others = sum(result["others_moved"] for result in results)
    if others:
        out["errors"].append(f"after the kill: {others} nodes of the live replicas moved too")
    out["failover_resync_s"] = max(result["resynced_at"] for result in results) - killed
    synced = sum(result["synced"] for result in results)
    if synced != out["nodes"]:
        out["errors"].append(f"after the kill: {synced} of {out['nodes']} synced")
    out["configs_equal_after_failover"] = await _configs_equal(clients, out)


def run(nodes: int, pops: int, groups: int, counts: list[int], runs: int) -> dict[str, Any]:
    rounds = []
    for number in range(runs):
        done = {}
        for replicas in counts:
            with tempfile.TemporaryDirectory(prefix="ballast-replicas-") as folder:
                result = asyncio.run(one(replicas, nodes, pops, groups, Path(folder)))
            done[str(replicas)] = result
            print(f"  run {number + 1}, {replicas} replica(s): storm "
                  f"{result.get('storm_s', float('nan')):.1f} s, one-PoP p50 "
                  f"{median(result.get('one_pop_s') or [float('nan')]) * 1e3:.0f} ms, global "
                  f"{max(result.get('global_s') or [float('nan')]):.1f} s, load "
                  f"{result['loadavg'][0]:.1f}"
                  + (f"  ERRORS: {result['errors']}" if result["errors"] else ""), flush=True)
        rounds.append(done)
    return {"nodes": nodes, "pops": pops, "groups": groups, "counts": counts, "runs": rounds}


def errors(results: dict[str, Any]) -> list[str]:
    return [f"run {number + 1}, {count} replica(s): {error}"
            for number, done in enumerate(results["runs"])
            for count, result in done.items() for error in result["errors"]]


def _pct(values: list[float], pct: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))] \
        if ordered else float("nan")


def _ratio(value: float, base: float) -> float:
    """`value ÷ base`; NaN (not shown) where the base is 0 (no lease lost, no node moved)."""
    return value / base if base else float("nan")


def report(results: dict[str, Any]) -> str:
    counts = [str(count) for count in results["counts"]]
    rounds = results["runs"]
    base = counts[0]

    def pick(result: dict[str, Any], key: str) -> float:
        value = result.get(key)
        if key == "one_pop_p50":
            return _pct(result.get("one_pop_s") or [], 50)
        if key == "one_pop_p99":
            return _pct(result.get("one_pop_s") or [], 99)
        if key == "global_worst":
            return max(result.get("global_s") or [float("nan")])
        if key in ("storm_server_cpu_per_node_us", "global_server_cpu_per_node_us"):
            return sum(value) if value else float("nan")  # every replica's, per node
        if key == "busiest_storm_cpu":
            cpu = result.get("storm_server_cpu_per_node_us") or []
            return max(cpu) * result["nodes"] / 1e6 if cpu else float("nan")
        return float("nan") if value is None else float(value)

    metrics = [
        ("reconnect storm: all nodes synced", "storm_s", 1, "s"),
        ("  the busiest replica's CPU in it", "busiest_storm_cpu", 1, "s"),
        ("  server CPU per node, all replicas", "storm_server_cpu_per_node_us", 1, "µs"),
        ("  the simulated nodes' CPU per node", "storm_client_cpu_per_node_us", 1, "µs"),
        ("one-PoP change: push -> last ACK, p50", "one_pop_p50", 1e3, "ms"),
        ("one-PoP change: push -> last ACK, p99", "one_pop_p99", 1e3, "ms"),
        ("global change: push -> last ACK of all nodes", "global_worst", 1e3, "ms"),
        ("  server CPU per node, all replicas", "global_server_cpu_per_node_us", 1, "µs"),
        ("a replica killed: its nodes synced again", "failover_resync_s", 1, "s"),
        ("  nodes that moved", "failover_moved", 1, ""),
        ("the leader's lease lost (its push made again)", "deposed", 1, ""),
    ]
    rows = []
    for label, key, scale, unit in metrics:
        cells = [spread([pick(done[count], key) for done in rounds], scale, unit)
                 for count in counts]
        ratios = [spread([_ratio(pick(done[count], key), pick(done[base], key))
                          for done in rounds]) for count in counts[1:]]
        rows.append([label, *cells, *ratios])
    equal = [all(done[count].get("configs_equal") and done[count].get(
        "configs_equal_after_failover", True) for done in rounds) for count in counts]
    rows.append(["every node's config equal across replicas",
                 *("yes" if ok else "NO" for ok in equal), *([""] * (len(counts) - 1))])
    loads = [load for done in rounds for result in done.values() for load in result["loadavg"]]
    text = [f"{results['nodes']:,} nodes, {results['pops']} PoPs x {results['groups']} groups, "
            f"{len(rounds)} run(s): median (min-max); load average {min(loads):.1f}-"
            f"{max(loads):.1f}",
            table(["", *(f"{count} replica(s)" for count in counts),
                   *(f"{count} ÷ {base}" for count in counts[1:])], rows)]
    failed = errors(results)
    if failed:
        text.append("errors: " + "; ".join(failed))
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replicas", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pops", type=int, default=100)
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--replicas", default="1,2", help="replica counts (default 1,2)")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args(argv)
    results = run(args.nodes, args.pops, args.groups,
                  [int(count) for count in args.replicas.split(",")], args.runs)
    saved = ROOT / "bench" / "results" / "replicas.json"
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(report(results))
    print(f"(every figure: {saved.relative_to(ROOT)})")
    return 1 if errors(results) else 0


if __name__ == "__main__":
    sys.exit(main())
