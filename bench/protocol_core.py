"""The sans-I/O ADS core alone (no gRPC): per-stream CPU of a push and of an ACK.

N streams of one PoP go through Envoy's start-up exchange (CDS wildcard, EDS for every cluster,
LDS wildcard, RDS by name) and ACK everything; then the PoP's snapshot alternates between two
generations that differ in one origin group's weights (what `bench.fanout` pushes), and each
round times `on_resources` for every stream, then the ACK of every response it produced.

Two implementations run interleaved in one process, so their ratio is not skewed by the load
of the (shared, noisy) machine: `control_plane.ads.sotw` and `control_plane.ads.delta`
(current: per-snapshot index, views and diffs shared by every stream) and
`harness.protocol_baseline` (a verbatim copy of the protocol core before that change, which
copied, sorted and hashed every resource of a type per stream on every push and ACK).
`python -m bench.protocol_core [--streams N] [--rounds R]`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from typing import Any

from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest, DiscoveryRequest

from bench.common import desired_by_name, median, table
from control_plane.ads.delta import DeltaStream
from control_plane.ads.sotw import SotwStream
from control_plane.translate.resources import (
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    LISTENER_TYPE,
    ROUTE_TYPE,
    Capabilities,
    PopResources,
)
from control_plane.xds_port.server import intent_and_cache
from harness import protocol_baseline
from harness.intent_changes import set_weights

# name -> (SotW stream, delta stream) of each implementation
IMPLEMENTATIONS: dict[str, tuple[type[Any], type[Any]]] = {
    "baseline": (protocol_baseline.SotwStream, protocol_baseline.DeltaStream),
    "current": (SotwStream, DeltaStream),
}
STARTUP = (CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE)


def generations(desired_name: str, pop: str = "ewr") -> tuple[PopResources, PopResources]:
    """Two snapshots of `pop` that differ in one origin group's weights (10 points moved)."""
    intent, cache = intent_and_cache(desired_by_name(desired_name))
    first = cache.resources(pop, Capabilities())
    group = intent.desired.origin_groups[0]
    weights = intent.weights(pop, group.name)
    names = sorted(weights, key=lambda n: -weights[n])
    moved = dict(weights)
    moved[names[0]] -= 10
    moved[names[-1]] += 10
    asyncio.run(set_weights(intent, pop, group.name, moved))
    second = cache.resources(pop, Capabilities())
    assert second is not first
    return first, second


def _names(snapshot: PopResources, type_url: str) -> tuple[str, ...]:
    return tuple(sorted(snapshot.of_type(type_url)))


def sotw_request(type_url: str, names: tuple[str, ...], nonce: str = "") -> DiscoveryRequest:
    return DiscoveryRequest(type_url=type_url, resource_names=names, response_nonce=nonce)


def delta_request(
    type_url: str, subscribe: tuple[str, ...] = (), nonce: str = ""
) -> DeltaDiscoveryRequest:
    return DeltaDiscoveryRequest(
        type_url=type_url, resource_names_subscribe=subscribe, response_nonce=nonce
    )


def subscriptions(snapshot: PopResources) -> dict[str, tuple[str, ...]]:
    """What an Envoy names per type: CDS/LDS wildcard, EDS every cluster, RDS every route."""
    return {
        CLUSTER_TYPE: (),
        ENDPOINT_TYPE: _names(snapshot, CLUSTER_TYPE),
        LISTENER_TYPE: (),
        ROUTE_TYPE: _names(snapshot, ROUTE_TYPE),
    }


def ack_for(mode: str, response: Any, subs: dict[str, tuple[str, ...]]) -> Any:
    if mode == "sotw":
        return sotw_request(response.type_url, subs[response.type_url], response.nonce)
    return delta_request(response.type_url, nonce=response.nonce)


def connect(impl: tuple[type[Any], type[Any]], mode: str, snapshot: PopResources,
            streams: int) -> list[Any]:
    subs = subscriptions(snapshot)
    result = []
    for _ in range(streams):
        stream = impl[0]() if mode == "sotw" else impl[1]()
        for type_url in STARTUP:
            names = subs[type_url]
            request = (
                sotw_request(type_url, names) if mode == "sotw" else delta_request(type_url, names)
            )
            step = stream.on_request(request, snapshot)
            for response in step.responses:
                stream.on_request(ack_for(mode, response, subs), snapshot)
        result.append(stream)
    return result


def one_round(
    mode: str, streams: list[Any], snapshot: PopResources, subs: dict[str, tuple[str, ...]]
) -> tuple[float, float, int, int]:
    """(push seconds, ACK seconds, responses, resources sent) over all streams."""
    clock = time.perf_counter
    start = clock()
    steps = [stream.on_resources(snapshot) for stream in streams]
    push = clock() - start
    acks = [[ack_for(mode, r, subs) for r in step.responses] for step in steps]  # not timed
    start = clock()
    for stream, requests in zip(streams, acks, strict=True):
        for request in requests:
            stream.on_request(request, snapshot)
    ack = clock() - start
    responses = sum(len(step.responses) for step in steps)
    sent = sum(len(r.resources) for step in steps for r in step.responses)
    return push, ack, responses, sent


def run(
    *, desired: tuple[str, ...] = ("example", "large"), modes: tuple[str, ...] = ("sotw", "delta"),
    streams: int = 500, rounds: int = 9, impls: tuple[str, ...] = ("baseline", "current"),
) -> list[dict[str, Any]]:
    rows = []
    for desired_name in desired:
        gens = generations(desired_name)
        subs = subscriptions(gens[0])
        for mode in modes:
            fleets = {name: connect(IMPLEMENTATIONS[name], mode, gens[0], streams)
                      for name in impls}
            samples: dict[str, list[tuple[float, float, int, int]]] = {n: [] for n in impls}
            for r in range(rounds):
                snapshot = gens[(r + 1) % 2]
                # alternate which implementation goes first: load drifts within a round too
                order = impls if r % 2 == 0 else tuple(reversed(impls))
                for name in order:
                    gc.collect()
                    samples[name].append(one_round(mode, fleets[name], snapshot, subs))
            for name in impls:
                pushes = [s[0] / streams * 1e6 for s in samples[name]]
                acks_us = [s[1] / streams * 1e6 for s in samples[name]]
                rows.append({
                    "desired": desired_name, "mode": mode, "impl": name, "streams": streams,
                    "push_us": median(pushes), "push_us_min": min(pushes),
                    "push_us_max": max(pushes), "ack_us": median(acks_us),
                    "ack_us_min": min(acks_us), "ack_us_max": max(acks_us),
                    "responses_per_stream": samples[name][-1][2] / streams,
                    "resources_per_stream": samples[name][-1][3] / streams,
                })
    return rows


def report(rows: list[dict[str, Any]]) -> str:
    body = [
        (r["desired"], r["mode"], r["impl"], r["push_us"],
         f"{r['push_us_min']:.1f}-{r['push_us_max']:.1f}", r["ack_us"],
         f"{r['ack_us_min']:.1f}-{r['ack_us_max']:.1f}", r["resources_per_stream"])
        for r in rows
    ]
    out = [table(("desired", "mode", "impl", "push µs/stream", "range", "ACK µs/stream",
                  "range", "resources sent/stream"), body)]
    by_key = {(r["desired"], r["mode"], r["impl"]): r for r in rows}
    ratios = []
    for (d, m, impl), r in by_key.items():
        base = by_key.get((d, m, "baseline"))
        if impl == "baseline" or base is None:
            continue
        ratios.append((d, m, base["push_us"] / r["push_us"], base["ack_us"] / r["ack_us"],
                       (base["push_us"] + base["ack_us"]) / (r["push_us"] + r["ack_us"])))
    if ratios:
        out.append(table(("desired", "mode", "push baseline÷current", "ACK baseline÷current",
                          "push+ACK baseline÷current"), ratios))
    return "\n\n".join(out)


def profile(impl: str, mode: str, desired: str = "large", streams: int = 200) -> None:
    """cProfile of a few push+ACK rounds of one implementation (top functions by tottime)."""
    import cProfile
    import pstats

    gens = generations(desired)
    subs = subscriptions(gens[0])
    fleet = connect(IMPLEMENTATIONS[impl], mode, gens[0], streams)
    profiler = cProfile.Profile()
    profiler.enable()
    for r in range(4):
        one_round(mode, fleet, gens[(r + 1) % 2], subs)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(14)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.protocol_core", description=__doc__)
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--profile", metavar="IMPL:MODE", help="e.g. baseline:sotw")
    args = parser.parse_args(argv)
    if args.profile:
        impl, mode = args.profile.split(":")
        profile(impl, mode, streams=args.streams)
        return
    print(report(run(streams=args.streams, rounds=args.rounds)))



if __name__ == "__main__":
    main()
