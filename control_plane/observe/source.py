"""The one interface `decide` reads through: rolling windows of per-origin signals.

Every source (the embedded metrics_service sink, Prometheus, either merged with active probes)
answers the same question: over the window ending at `now_ms`, what did each PoP see of each
origin of each origin group? Times are milliseconds on the wall clock (epoch), the clock the sink
stamps arrivals with and Prometheus stores samples with.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Protocol

from control_plane.decide.signals import GroupSignals, GroupTierPending

PopGroup = tuple[str, str]  # (PoP, origin group)
Signals = dict[PopGroup, GroupSignals]
TierSignals = dict[PopGroup, GroupTierPending]


class MetricSource(Protocol):
    async def window(self, now_ms: int, window_ms: int) -> Signals:
        """Signals per (PoP, group) -> origin over (now_ms - window_ms, now_ms].

        A (PoP, group) or origin with no sample in the window is absent: the caller holds.
        """
        ...


class TierSource(Protocol):
    async def tier_pending(self, now_ms: int, window_ms: int) -> TierSignals:
        """Per (PoP, group) -> tier: the highest `upstream_rq_pending_active` of the tier's
        cluster over (now_ms - window_ms, now_ms], the PoP's Envoys summed.

        A tier cluster with no sample in the window is absent: the caller holds.
        """
        ...


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def silent_nodes(connected: Mapping[str, Mapping[str, int]], signals: Signals,
                 reporting: set[str] | None, since_ms: int) -> dict[str, tuple[str, ...]]:
    """PoP -> its nodes connected since `since_ms` or before (`connected`: PoP -> node id ->
    connected at, ms; a node that just connected has not flushed yet) that the metric source
    did not hear from in the window: where the source knows who sent what (`reporting`: node
    ids, the sink), those not in it; else (Prometheus labels stats by PoP, not node) every
    such node of a PoP without any signal. Pure."""
    heard = {pop for pop, _ in signals}
    silent: dict[str, tuple[str, ...]] = {}
    for pop, nodes in connected.items():
        names = sorted(node for node, at in nodes.items() if at <= since_ms)
        quiet = ([n for n in names if n not in reporting] if reporting is not None
                 else names if pop not in heard else [])
        if quiet:
            silent[pop] = tuple(quiet)
    return silent


def silent_fix(pop: str, nodes: Iterable[str], source: str) -> str:
    """What an operator does about `nodes` of `pop` that send no metrics (`source`: `sink`,
    `prometheus`, `lrs` or one of them `+lrs`), in words."""
    names = ", ".join(nodes)
    if source == "lrs":
        return (f"node(s) {names} of PoP {pop} send no load reports to Ballast: start their "
                f"Envoy from `ballast bootstrap --pop {pop} --node-id <id> --load-reports`; a "
                "gRPC client reports while it calls a gRPC service")
    source = source.removesuffix("+lrs")
    if source == "prometheus":
        return (f"no Prometheus series with ballast_pop=\"{pop}\" from node(s) {names}: add "
                f"their admin /stats/prometheus (or a `ballast bootstrap --stats-listener`) to "
                f"Prometheus' scrape targets, labelled ballast_pop: {pop}")
    return (f"node(s) {names} of PoP {pop} stream no stats to Ballast: start their Envoy from "
            f"`ballast bootstrap --pop {pop} --node-id <id> --metrics-sink` (the stats sinks "
            "stream to the xDS port)")
