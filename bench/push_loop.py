"""Loop time of the push after a reload's swap: `python -m bench.push_loop`.

100 PoPs x 50 origin groups, one delta stream per PoP holding every resource (CDS, EDS, LDS,
RDS), in this process. Each round applies the edit of `bench.reload_loop` (g000's critical read
timeout) or back through the output cache's prepare and commit, as a reload does, then times
`on_resources` of every stream: what the loop computes for the push before it writes. "prepared"
pushes the committed snapshots (their views, versions and diffs computed by the prepare,
`ads/index.warm_like`); "unprepared" pushes copies of them with nothing computed yet (the cost
before). The collector makes young collections only, as during a reload
(`lifecycle/heap.reload_heap`).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest

from control_plane.ads.delta import DeltaStream
from control_plane.ads.snapshots import SnapshotCache
from control_plane.desired import parse_desired
from control_plane.intent.carry_over import carry_over
from control_plane.intent.running import RunningIntent
from control_plane.intent.served import served_of
from control_plane.lifecycle.heap import release_heap, reload_heap
from control_plane.translate.resources import (
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    LISTENER_TYPE,
    ROUTE_TYPE,
    Capabilities,
    PopResources,
)
from control_plane.translate.served import served_pops, translate_served, used_capabilities
from harness.ads_desired import fleet_yaml

POPS, GROUPS = 100, 50


def one_run(prepared: bool, rounds: int) -> list[float]:
    text = fleet_yaml(pops=POPS, groups=GROUPS)
    head, _, tail = text.partition("  g000:\n")
    edited = f"{head}  g000:\n    tiers: {{critical: {{read_timeout: 3s}}}}\n{tail}"
    before = RunningIntent(parse_desired(text.encode(), "before"))
    after = carry_over(before, parse_desired(edited.encode(), "after")).intent
    cache = SnapshotCache(translate_served, served_pops, served_of(before), used_capabilities)
    caps = Capabilities()
    streams: list[tuple[str, DeltaStream]] = []
    for pop in before.desired.pop_names:
        snapshot, stream = cache.resources(pop, caps), DeltaStream()
        for type_url in (CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE):
            names = () if type_url in (CLUSTER_TYPE, LISTENER_TYPE) else tuple(
                snapshot.of_type(type_url))
            ask = DeltaDiscoveryRequest(type_url=type_url, resource_names_subscribe=names)
            for response in stream.on_request(ask, snapshot).responses:
                stream.on_request(DeltaDiscoveryRequest(
                    type_url=type_url, response_nonce=response.nonce), snapshot)
        streams.append((pop, stream))
    times = []
    with reload_heap():
        for n in range(rounds):
            target = served_of(after if n % 2 == 0 else before)
            cache.commit(cache.prepare(target)(), target)
            pushed: dict[str, PopResources] = {
                pop: cache.resources(pop, caps) for pop, _ in streams}
            if not prepared:  # the same content, nothing derived from it yet
                pushed = {pop: dataclasses.replace(s) for pop, s in pushed.items()}
            started = time.perf_counter()
            outputs = [stream.on_resources(pushed[pop]) for pop, stream in streams]
            times.append((time.perf_counter() - started) * 1000)
            for (pop, stream), output in zip(streams, outputs, strict=True):
                for response in output.responses:
                    stream.on_request(DeltaDiscoveryRequest(
                        type_url=response.type_url, response_nonce=response.nonce), pushed[pop])
    release_heap()  # what the run built is no one's to keep: the next run starts afresh
    return times


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.push_loop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2, help="runs of each kind, interleaved")
    parser.add_argument("--rounds", type=int, default=5, help="reloads (pushes) per run")
    args = parser.parse_args(argv)
    figures: dict[str, list[float]] = {"unprepared": [], "prepared": []}
    for n in range(args.runs):
        for kind in figures:
            times = one_run(kind == "prepared", args.rounds)
            figures[kind] += times
            print(f"run {n + 1} {kind}: " + " ".join(f"{t:.1f}" for t in times) + " ms",
                  flush=True)
    for kind, times in figures.items():
        print(f"{kind}: push of {POPS} PoPs (one delta stream each) {spread(times)} ms on the loop")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
