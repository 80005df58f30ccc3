"""The fleet benchmark: N simulated nodes over P PoPs, Ballast against the raw grpc.aio floor.

For each side (`bench/fleet_server.py`: `floor` first, then `ballast`, each a fresh server
process driven from a fresh client process), in this order:

1. **reconnect storm**: every node connects at once (at most `CONNECTING` doing their start-up
   exchange at a time, as Envoys' jittered back-off spreads them); time until the server has
   every node's four ACKs. Halfway through, one PoP's weights change: time until as many of its
   nodes hold the new version as had synced when it was pushed;
2. server RSS and CPU per connected node;
3. **one-PoP weight change**, repeated: push -> last ACK of that PoP's nodes (p50, p99);
4. **global change**: one origin group shifts in every PoP in one loop callback: that
   callback's time (`tick`) and push -> last ACK of all nodes;
5. the largest event-loop stall of each phase (a 5 ms sleep, measured in the server).

Separately, in this process: a real `Reconciler` tick over P x G pairs in which one group
breaches in every PoP (so it shifts everywhere), with its time on the event loop (each step of
the tick's coroutine timed: the steps, the planning and the translations it awaits on a worker
thread are not in it) and the loop's largest stall.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Generator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from bench.command_pipe import ServerProcess
from bench.common import median, table
from bench.fanout import BenchClient, all_synced
from harness.xds_client import XdsClient, connect, local_channel, make_node

CONNECTING = 500


def _lag(out: dict[str, Any], phase: str, lag: dict[str, float]) -> None:
    out[f"stall_{phase}_s"] = lag["worst"]
    out[f"gc_longest_{phase}_s"] = lag["gc_longest"]
    out[f"gc_total_{phase}_s"] = lag["gc_total"]
    out[f"gc_longest_cpu_{phase}_s"] = lag["gc_longest_cpu"]


def pop_of(index: int, pops: int) -> str:
    return f"p{index % pops:03d}"


async def run_side(kind: str, pops: int, groups: int, nodes: int, per_connection: int,
                   pushes: int, timeout: float = 600.0, push_timeout: float = 120.0,
                   variant: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"side": kind, "variant": variant, "nodes": nodes, "pops": pops,
                           "groups": groups, "errors": []}
    server = ServerProcess(
        [sys.executable, "-m", "bench.fleet_server", kind, str(pops), str(groups),
         *([variant] if variant else [])],
        stop_wait_s=20)
    connections = -(-nodes // per_connection)
    channels: list[grpc.aio.Channel] = []
    clients: list[XdsClient] = []
    try:
        target = f"127.0.0.1:{server.port}"
        channels = [local_channel(target) for _ in range(connections)]
        clients = [BenchClient(channels[i // per_connection],
                               make_node(f"bench-{i}", pop_of(i, pops)), delta=False)
                   for i in range(nodes)]
        await asyncio.sleep(0.5)
        await server.call(cmd="lag")
        rss0, cpu0 = server.rss(), server.cpu()
        connected = {"all": 0, "p000": 0}
        gate = asyncio.Semaphore(CONNECTING)

        async def gated(index: int, client: XdsClient) -> None:
            async with gate:
                await connect(client, timeout)
            connected["all"] += 1
            if pop_of(index, pops) == "p000":
                connected["p000"] += 1

        start, client_cpu0 = time.monotonic(), time.process_time()
        storm = asyncio.ensure_future(asyncio.wait_for(
            asyncio.gather(*(gated(i, c) for i, c in enumerate(clients))), timeout))
        while connected["all"] < nodes // 2 and not storm.done():
            await asyncio.sleep(0.02)
        if connected["p000"]:
            during = await server.call(cmd="push", pops=["p000"], expect=connected["p000"],
                                       timeout=push_timeout)
            out["storm_push_s"] = during["last_ack"] - during["start"]
            out["storm_push_nodes"] = connected["p000"]
        await storm
        synced = await all_synced(server, nodes, 30)
        if synced["synced"] != nodes:
            out["errors"].append(
                f"only {synced['synced']} of {nodes} nodes synced (streams seen ACKing: "
                f"{synced['streams']}, by number of start-up types ACKed: "
                f"{synced['types_acked']})")
        # the pushes below wait for the nodes that synced
        by_pop: dict[str, int] = synced["by_pop"]
        everyone_synced = int(synced["synced"])
        out["storm_s"] = synced["last_sync"] - start
        out["storm_cpu_per_node_us"] = (server.cpu() - cpu0) * 1e6 / nodes
        out["storm_client_cpu_per_node_us"] = (time.process_time() - client_cpu0) * 1e6 / nodes
        _lag(out, "storm", await server.call(cmd="lag"))
        await asyncio.sleep(1.0)  # let the server settle before reading RSS
        out["rss_per_node"] = (server.rss() - rss0) / nodes
        heap = await server.call(cmd="heap")
        out["walked_per_node"] = heap["walked"] / nodes  # what a full collection walks
        out["frozen_per_node"] = heap["frozen"] / nodes
        await server.call(cmd="lag")
        one: list[float] = []
        for n in range(pushes):
            pop = pop_of(n, min(pops, 5))
            expect = by_pop.get(pop, 0)
            reply = await server.call(cmd="push", pops=[pop], expect=expect,
                                      timeout=push_timeout)
            if not reply["ok"]:
                out["errors"].append(f"one-PoP push {n}: {reply['acks']} of {expect} ACKed")
                break
            one.append(reply["last_ack"] - reply["start"])
            await asyncio.sleep(0.05)
        out["one_pop_s"] = one
        _lag(out, "one_pop", await server.call(cmd="lag"))
        everyone: list[float] = []
        ticks: list[float] = []
        cpu0 = server.cpu()
        for n in range(2):
            reply = await server.call(cmd="push", pops="*", expect=everyone_synced,
                                      timeout=push_timeout)
            if not reply["ok"]:
                out["errors"].append(
                    f"global push {n}: {reply['acks']} of {everyone_synced} ACKed")
                break
            everyone.append(reply["last_ack"] - reply["start"])
            ticks.append(reply["tick_s"])
            await asyncio.sleep(0.5)
        out["global_s"] = everyone
        out["global_tick_s"] = ticks
        out["global_cpu_per_node_us"] = (server.cpu() - cpu0) * 1e6 / max(1, 2 * nodes)
        _lag(out, "global", await server.call(cmd="lag"))
        broken = [c for c in clients if c.error is not None]
        if broken:
            out["errors"].append(f"{len(broken)} streams failed, e.g. {broken[0].error}")
    except Exception as err:  # a benchmark reports what went wrong and carries on
        out["errors"].append(f"{type(err).__name__}: {err}")
    finally:
        for client in clients:
            await client.close()
        for channel in channels:
            await channel.close()
        server.stop()
    return out


def _side_in_process(kind: str, pops: int, groups: int, nodes: int, per_connection: int,
                     pushes: int, variant: str = "") -> dict[str, Any]:
    return asyncio.run(run_side(kind, pops, groups, nodes, per_connection, pushes,
                                variant=variant))


# -- the reconcile tick, in this process -----------------------------------------------------

class OnLoop:
    """Awaits a coroutine and times each of its steps: the time it holds the event loop
    (what it awaits on worker threads is not in it; what the loop does for others meanwhile is
    not either)."""

    def __init__(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        self.coroutine = coroutine
        self.spent = 0.0
        self.longest = 0.0

    def __await__(self) -> Generator[Any, Any, Any]:
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            started = time.perf_counter()
            try:
                yielded = (self.coroutine.send(sent) if thrown is None
                           else self.coroutine.throw(thrown))
            except StopIteration as done:
                self._add(time.perf_counter() - started)
                return done.value
            self._add(time.perf_counter() - started)
            sent, thrown = None, None
            try:
                sent = yield yielded
            except BaseException as err:  # handed on to the coroutine, as `await` would
                thrown = err

    def _add(self, seconds: float) -> None:
        self.spent += seconds
        self.longest = max(self.longest, seconds)


async def tick_cost(pops: int, groups: int) -> dict[str, Any]:
    from control_plane.decide.signals import OriginSignals
    from control_plane.decisions.log import DecisionLog
    from control_plane.decisions.recorder import DecisionRecorder
    from control_plane.intent.sqlite_store import StateStore
    from control_plane.intent.store import IntentBatch
    from control_plane.lifecycle.heap import release_heap, settle_heap
    from control_plane.reconcile.reconcile import Reconciler
    from control_plane.translate.resources import Capabilities
    from control_plane.xds_port.server import intent_and_cache
    from harness.models import fleet_desired

    desired = fleet_desired(pops, groups)

    class Breaching:
        """Every pair healthy, except g000's preferred origin in every PoP (30 % errors);
        assembled on a worker thread, as the Prometheus source assembles its answers."""

        async def window(self, now_ms: int, window_ms: int) -> dict[Any, Any]:
            def origin(errors: int) -> OriginSignals:
                return OriginSignals(1000, errors, 0, 20.0, 60.0, 0.0, 0, 1.0, now_ms)

            return await asyncio.to_thread(lambda: {
                (pop, group.name): {
                    name: origin(300 if group.name == "g000" and name == group.preference[
                        pop][0] else 0) for name in group.preference[pop]}
                for pop in desired.pop_names for group in desired.origin_groups
            })

    store_writes = [0]

    class CountingStore(StateStore):
        async def write(self, batch: IntentBatch) -> None:
            store_writes[0] += len(batch.groups) + len(batch.records)
            await super().write(batch)

    with tempfile.TemporaryDirectory() as folder:
        store = CountingStore(Path(folder))
        log = DecisionLog(Path(folder))
        intent, cache = intent_and_cache(desired, store=store, recorder=DecisionRecorder(log))
        for pop in desired.pop_names:
            cache.resources(pop, Capabilities())
        reconciler = Reconciler(intent, Breaching(), seed=1)
        probe_worst = [0.0]

        async def probe() -> None:
            while True:
                started = time.perf_counter()
                await asyncio.sleep(0.005)
                probe_worst[0] = max(probe_worst[0], time.perf_counter() - started - 0.005)

        rows = []
        now = 1_800_000_000_000
        pushed: list[frozenset[str]] = []
        cache.add_listener(pushed.append)
        settle_heap()  # as `ballast serve` does once it is ready
        gc_longest = [0.0]
        gc_started = [0.0]

        def on_gc(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                gc_started[0] = time.perf_counter()
            else:
                gc_longest[0] = max(gc_longest[0], time.perf_counter() - gc_started[0])

        gc.callbacks.append(on_gc)
        for tick in range(6):  # breach, breach, shift x 4 (streaks at their caps from the 3rd)
            probe_worst[0] = gc_longest[0] = 0.0
            task = asyncio.create_task(probe())
            await asyncio.sleep(0.02)
            pushed.clear()
            before = store_writes[0]
            started = time.perf_counter()
            timed = OnLoop(reconciler.tick(now + tick * 20_000))
            outcomes = await timed
            wall = time.perf_counter() - started
            await asyncio.sleep(0.02)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            shifted = sum(1 for o in outcomes if o.weights != o.result.weights_before)
            rows.append({"tick": tick, "wall_s": wall, "loop_s": timed.spent,
                         "longest_step_s": timed.longest, "gc_longest_s": gc_longest[0],
                         "stall_s": probe_worst[0], "shifted": shifted,
                         "pushed_pops": len(set().union(*pushed)),
                         "rows_written": store_writes[0] - before})
        gc.callbacks.remove(on_gc)
        release_heap()
        log.close()
        store.close()
    return {"pops": pops, "groups": groups, "ticks": rows}


# -- driver and report -----------------------------------------------------------------------

def run(nodes: int, pops: int, groups: int, per_connection: int, pushes: int, *,
        runs: int = 1, variants: Sequence[str] = ()) -> dict[str, Any]:
    """`runs` rounds, each: the floor, Ballast and each of `variants` (Ballast without one of
    its parts, `fleet_server.VARIANTS`), every side a fresh server and client process, then the
    reconcile tick; the load average noted at each side's start and end."""
    rounds: list[dict[str, Any]] = []
    context = multiprocessing.get_context("spawn")
    sides = [("floor", "floor", ""), ("ballast", "ballast", ""),
             *((variant, "ballast", variant) for variant in variants)]
    for number in range(runs):
        done: dict[str, Any] = {}
        for name, kind, variant in sides:
            load = os.getloadavg()[0]
            with ProcessPoolExecutor(1, mp_context=context) as pool:
                side = pool.submit(_side_in_process, kind, pops, groups, nodes, per_connection,
                                   pushes, variant).result()
            side["loadavg"] = [load, os.getloadavg()[0]]
            done[name] = side
            print(f"  run {number + 1}, {name}: storm {side.get('storm_s', float('nan')):.2f} s,"
                  f" one-PoP p50 {_pct(side.get('one_pop_s', []), 50) * 1e3:.1f} ms, global "
                  f"{_pct(side.get('global_s', []), 50):.2f} s, load {load:.1f}"
                  + (f"  ERRORS: {side['errors']}" if side["errors"] else ""), flush=True)
        done["tick"] = asyncio.run(tick_cost(pops, groups))
        rounds.append(done)
    return {"nodes": nodes, "pops": pops, "groups": groups, "variants": list(variants),
            "runs": rounds}


def errors(results: dict[str, Any]) -> list[str]:
    return [f"run {number + 1}, {name}: {error}"
            for number, done in enumerate(results["runs"])
            for name, side in done.items() if name != "tick" for error in side["errors"]]


def _pct(values: list[float], pct: int) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def _one(values: Any) -> float:
    return float("nan") if values is None else float(values)


def _worst(values: Any) -> float:
    return max(values) if values else float("nan")


def _p(n: int) -> Callable[[Any], float]:
    return lambda values: _pct(values or [], n)


# (label, key, scale, unit, how a side's values become one number, goal)
METRICS: list[tuple[str, str, float, str, Callable[[Any], float], str]] = [
    ("one-PoP change: push -> last ACK, p50", "one_pop_s", 1e3, "ms", _p(50), ""),
    ("one-PoP change: push -> last ACK, p99", "one_pop_s", 1e3, "ms", _p(99), "≤ 100 ms"),
    ("global change: push -> last ACK of all nodes", "global_s", 1e3, "ms", _worst,
     "≤ 1.2x floor"),
    ("global change: the pushing callback (loop time)", "global_tick_s", 1e3, "ms", _worst, ""),
    ("reconnect storm: all nodes synced", "storm_s", 1, "s", _one, "≤ 10 s"),
    ("one-PoP push during the storm", "storm_push_s", 1e3, "ms", _one, ""),
    ("server CPU per node during the storm", "storm_cpu_per_node_us", 1, "µs", _one, ""),
    ("server CPU per node in a global change", "global_cpu_per_node_us", 1, "µs", _one, ""),
    ("the simulated nodes' CPU per node during the storm", "storm_client_cpu_per_node_us", 1,
     "µs", _one, ""),
    ("server RSS per connected node", "rss_per_node", 1e-3, "KB", _one, "≤ 1.25x floor"),
    ("objects a full collection walks, per node", "walked_per_node", 1, "", _one, ""),
    ("largest loop stall: storm", "stall_storm_s", 1e3, "ms", _one, ""),
    ("largest loop stall: one-PoP pushes", "stall_one_pop_s", 1e3, "ms", _one, ""),
    ("largest loop stall: global change", "stall_global_s", 1e3, "ms", _one, "< 100 ms"),
    ("longest garbage collection: storm", "gc_longest_storm_s", 1e3, "ms", _one,
     "≤ 1.2x floor"),
    ("  its CPU", "gc_longest_cpu_storm_s", 1e3, "ms", _one, ""),
    ("time in garbage collection: storm", "gc_total_storm_s", 1e3, "ms", _one, ""),
    ("longest garbage collection: one-PoP pushes", "gc_longest_one_pop_s", 1e3, "ms", _one, ""),
    ("longest garbage collection: global change", "gc_longest_global_s", 1e3, "ms", _one,
     "≤ 1.2x floor"),
    ("  its CPU", "gc_longest_cpu_global_s", 1e3, "ms", _one, ""),
    ("time in garbage collection: global change", "gc_total_global_s", 1e3, "ms", _one, ""),
]
# the rows the variants table shows
VARIANT_KEYS = ("storm_s", "storm_cpu_per_node_us", "global_s", "stall_global_s",
                "gc_longest_storm_s", "gc_total_storm_s", "gc_longest_global_s",
                "gc_total_global_s", "walked_per_node")


def spread(values: Sequence[float], scale: float = 1.0, unit: str = "") -> str:
    """`median (min-max) unit` of what is not NaN (one value: itself)."""
    kept = sorted(v * scale for v in values if v == v)
    if not kept:
        return "n/a"
    suffix = f" {unit}" if unit else ""
    mid = median(kept)
    if len(kept) == 1:
        return f"{mid:,.{_digits(mid)}f}{suffix}"
    return (f"{mid:,.{_digits(mid)}f} ({kept[0]:,.{_digits(kept[0])}f}-"
            f"{kept[-1]:,.{_digits(kept[-1])}f}){suffix}")


def _digits(value: float) -> int:
    return 0 if abs(value) >= 100 else 1 if abs(value) >= 1 else 2


def report(results: dict[str, Any]) -> str:
    rounds = results["runs"]

    def values(side: str, key: str, pick: Callable[[Any], float]) -> list[float]:
        return [pick(done[side].get(key)) for done in rounds]

    def ratios(side: str, key: str, pick: Callable[[Any], float]) -> list[float]:
        return [b / f if f else float("nan")
                for b, f in zip(values(side, key, pick), values("floor", key, pick),
                                strict=True)]

    rows = [[label, spread(values("ballast", key, pick), scale, unit),
             spread(values("floor", key, pick), scale, unit),
             spread(ratios("ballast", key, pick)), goal]
            for label, key, scale, unit, pick, goal in METRICS]
    loads = [load for done in rounds for name, side in done.items() if name != "tick"
             for load in side["loadavg"]]
    text = [f"{len(rounds)} run(s): median (min-max); ratios taken within each run; load "
            f"average {min(loads):.1f}-{max(loads):.1f} over the sides",
            table(["", "Ballast", "floor", "Ballast ÷ floor", "goal"], rows)]
    if results["variants"]:
        by_key = {key: (label, pick) for label, key, _, _, pick, _ in METRICS}
        text.append("\nBallast without one of its parts (bench/fleet_server.VARIANTS), each "
                    "÷ the floor of the same run:")
        text.append(table(
            ["", "Ballast", *results["variants"]],
            [[by_key[key][0], *(spread(ratios(side, key, by_key[key][1]))
                                for side in ("ballast", *results["variants"]))]
             for key in VARIANT_KEYS]))
    ticks = [done["tick"] for done in rounds]
    text.append(f"\nReconcile tick, {ticks[0]['pops']} PoPs x {ticks[0]['groups']} groups (one "
                "group breaching in every PoP; in the benchmark process, no nodes):")

    def per_tick(index: int, key: str, scale: float = 1e3) -> str:
        return spread([tick["ticks"][index][key] for tick in ticks], scale)

    text.append(table(
        ["tick", "wall ms", "on the event loop ms (goal ≤ 20)", "its longest step ms",
         "largest loop stall ms", "longest GC ms", "pairs shifted", "PoPs re-translated",
         "store rows written"],
        [[row["tick"], per_tick(i, "wall_s"), per_tick(i, "loop_s"),
          per_tick(i, "longest_step_s"), per_tick(i, "stall_s"), per_tick(i, "gc_longest_s"),
          row["shifted"], row["pushed_pops"], row["rows_written"]]
         for i, row in enumerate(ticks[0]["ticks"])]))
    failed = errors(results)
    if failed:
        text.append("errors: " + "; ".join(failed))
    return "\n".join(text)
