"""Passive signals (sink or Prometheus) merged with the active probes: the source `decide` reads.

Probes run from Ballast, so one origin's probe share is the same in every PoP. An origin the
passive source has no sample of in a (PoP, group) it reported still appears when it was probed
(no traffic, p50/p95 None), stamped with the passive group's newest sample time so staleness
stays a property of the passive data.

Probes fill in where passive traffic is too thin (the failover source: a standby at its 5 % warm
pool sees a handful of requests a window): every origin carries the window's probe count (`probes`),
which `decide/evidence.py` adds to the attempts when those are too few, and when the passing probes
timed more answers than the passive latency has samples, their p50 / p95 replace it (`latency_from`
`probes`). Probes run from Ballast, not from the PoP: their latency is the origin's own plus
Ballast's path to it.
"""

from __future__ import annotations

from dataclasses import replace

from control_plane.decide.evidence import latency_samples, quantile_lower
from control_plane.decide.signals import OriginSignals
from control_plane.observe.access_log import nearest_rank
from control_plane.observe.probes import Prober
from control_plane.observe.source import MetricSource, Signals


class CombinedSource:
    """A MetricSource: `passive.window(...)` with `probe_success` filled in from `prober`."""

    def __init__(self, passive: MetricSource, prober: Prober) -> None:
        self.passive = passive
        self.prober = prober

    async def window(self, now_ms: int, window_ms: int) -> Signals:
        return merge_probes(await self.passive.window(now_ms, window_ms), self.prober,
                            now_ms, window_ms)


def merge_probes(passive: Signals, prober: Prober, now_ms: int, window_ms: int) -> Signals:
    probed: dict[str, list[str]] = {}
    for target in prober.targets:
        probed.setdefault(target.group, []).append(target.origin)
    merged: Signals = {}
    for (pop, group), origins in passive.items():
        newest = max((s.observed_at_ms for s in origins.values()), default=0)
        out = {name: replace(s, probe_success=prober.share(group, name, now_ms, window_ms))
               for name, s in origins.items()}
        for name in probed.get(group, []):
            share = prober.share(group, name, now_ms, window_ms)
            if name not in out and share is not None:
                out[name] = OriginSignals(
                    requests=0, errors_5xx=0, connect_failures=0, p50_ms=None, p95_ms=None,
                    pending_active=max((s.pending_active for s in origins.values()), default=0.0),
                    queue_overflow=max((s.queue_overflow for s in origins.values()), default=0),
                    probe_success=share, observed_at_ms=newest,
                )
        merged[pop, group] = {name: _filled_in(s, prober, group, name, now_ms, window_ms)
                              for name, s in out.items()}
    return merged


def _filled_in(signals: OriginSignals, prober: Prober, group: str, name: str, now_ms: int,
               window_ms: int) -> OriginSignals:
    """The probe count, and the probes' latency when they timed more answers than the passive
    latency has samples."""
    count = prober.count(group, name, now_ms, window_ms)
    timed = sorted(prober.latencies(group, name, now_ms, window_ms))
    if len(timed) <= latency_samples(signals):
        return replace(signals, probes=count)
    return replace(
        signals, probes=count, p50_ms=nearest_rank(timed, 0.5),
        p95_ms=nearest_rank(timed, 0.95), p95_low_ms=quantile_lower(timed, 0.95),
        latency_samples=len(timed), latency_from="probes",
    )
