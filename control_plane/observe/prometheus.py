"""The Prometheus metric source: PromQL over a Prometheus that scrapes Envoy's /stats/prometheus.

The stats tags of the edge bootstrap template (`translate/bootstrap_templates.py`) turn the
per-(PoP, origin) stats of a tier cluster into
`envoy_cluster_zone_upstream_rq_completed{ballast_cluster="shop.critical", local_zone="ewr",
upstream_zone="primary"}` (and `_rq_xx`, `_rq_time_bucket`); every Envoy stat also carries
`ballast_pop`, which is how the cluster-wide pending gauge and overflow counter find their PoP.
`increase()` handles counter resets the Prometheus way. prometheus-api-client is synchronous, so
every query runs in a worker thread. Times are epoch milliseconds (Prometheus' clock).

Per-origin attempts come from the per-host stats of the tier clusters
(`track_cluster_stats.per_endpoint_stats`), because Envoy does not charge retried attempts to the
zone `upstream_rq_<code>` stats. Measured on Envoy 1.40, /stats/prometheus shows them as
`envoy_cluster_endpoint_rq_total{envoy_cluster_name="shop.critical", envoy_endpoint_address=
"127.0.0.1:8081", ballast_pop="ewr"}` (also `_rq_error`, `_cx_connect_fail`; gauges `_healthy`,
`_rq_active`): the cluster name is whole here (unlike `envoy_cluster_name` on cluster stats) and
the fixed `ballast_pop` tag of the edge bootstrap template is applied to host stats too.
Operators whose
Envoys do not set that tag must give every scrape target a `ballast_pop` target label (e.g.
`static_configs: [{targets: [...], labels: {ballast_pop: ewr}}]`). The desired state
(constructor / `update_served`) maps (cluster, address) to the origin. Per (PoP, group, origin),
when host series exist in the window: `requests` = increase of `rq_total` (attempts),
`errors_5xx` = of `rq_error` minus `cx_connect_fail` (every failed attempt: 5xx, reset, timeout;
Envoy counts a connect failure as an `rq_error` too), `connect_failures` = of `cx_connect_fail`,
`abandoned` = `requests` minus the increase of `rq_success` minus `errors_5xx` (attempts Envoy
reset unfinished: a hedge won elsewhere, the client left; `decide/evidence.py`); otherwise the
zone counters as before.

Latency comes from the zone histogram, its tiers merged per (PoP, group, origin): the window's
increase of every bucket (`latency_buckets`, one query) and, from those buckets, the same
arithmetic as the sink's (`observe/window.py` `quantile`, PromQL's `histogram_quantile` rule):
p50, p95, the observation count behind them (`latency_samples`: the `le="+Inf"` bucket, i.e.
the increase of `_rq_time_count`) and the p95's lower confidence bound, so the evidence rules
(`decide/evidence.py`: `min_samples`, the bound) judge a Prometheus window as they judge a sink
window: a p95 of too few observations is inconclusive, not a breach.

For the tier controller, `tier_pending` asks `max_over_time` of the pending gauge per (PoP, tier
cluster), the worst Envoy's (`max by`: breakers and queue policies act per Envoy), each Envoy's
(`instance`) peak of `upstream_rq_active`, and `upstream_queue_overloaded` where a node reports
it (`tier_queries`, `assemble_tiers`). The pool wait comes from the access-log sink either way.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from requests import RequestException

from control_plane.decide.evidence import abandoned_attempts, quantile_lower_rank
from control_plane.decide.signals import OriginSignals, TierPending
from control_plane.desired.model import Desired
from control_plane.observe.endpoints import ServedEndpoints, served_endpoints
from control_plane.observe.source import Signals, TierSignals
from control_plane.observe.window import Buckets, quantile, split_cluster

log = logging.getLogger(__name__)

ZONE = ("local_zone", "ballast_cluster", "upstream_zone")
QUANTILE = ("local_zone", "ballast_group", "upstream_zone")
HOST = ("ballast_pop", "envoy_cluster_name", "envoy_endpoint_address")
HOST_SIGNALS = {
    "host_requests": "requests",
    "host_successes": "successes",
    "host_errors": "errors_5xx",
    "host_connect_failures": "connect_failures",
    "host_observed_at": "observed_at",
}


class PrometheusQueryError(RuntimeError):
    pass


def queries(window_ms: int) -> dict[str, str]:
    """The PromQL behind one window, by signal."""
    r = f"[{window_ms}ms]"
    by = "local_zone, ballast_cluster, upstream_zone"
    host = ", ".join(HOST)
    # tiers of a group merge before the quantile: ballast_group = ballast_cluster minus ".<tier>"
    grown = (
        f"label_replace(increase(envoy_cluster_zone_upstream_rq_time_bucket{r}), "
        '"ballast_group", "$1", "ballast_cluster", "(.+)[.][^.]+")'
    )
    return {
        "requests": f"sum by ({by}) (increase(envoy_cluster_zone_upstream_rq_completed{r}))",
        "errors_5xx": f"sum by ({by}) "
        f'(increase(envoy_cluster_zone_upstream_rq_xx{{envoy_response_code_class="5"}}{r}))',
        "latency_buckets": f"sum by (local_zone, ballast_group, upstream_zone, le) ({grown})",
        "observed_at": f"max by ({by}) "
        f"(timestamp(envoy_cluster_zone_upstream_rq_completed) "
        f"and last_over_time(envoy_cluster_zone_upstream_rq_completed{r}))",
        "pending_active": "sum by (ballast_pop, ballast_cluster) "
        f"(last_over_time(envoy_cluster_upstream_rq_pending_active{r}))",
        "queue_overflow": "sum by (ballast_pop, ballast_cluster) "
        f"(increase(envoy_cluster_upstream_rq_pending_overflow{r}))",
        "host_requests": f"sum by ({host}) (increase(envoy_cluster_endpoint_rq_total{r}))",
        "host_successes": f"sum by ({host}) (increase(envoy_cluster_endpoint_rq_success{r}))",
        "host_errors": f"sum by ({host}) (increase(envoy_cluster_endpoint_rq_error{r}))",
        "host_connect_failures": f"sum by ({host}) "
        f"(increase(envoy_cluster_endpoint_cx_connect_fail{r}))",
        "host_observed_at": f"max by ({host}) "
        f"(timestamp(envoy_cluster_endpoint_rq_total) "
        f"and last_over_time(envoy_cluster_endpoint_rq_total{r}))",
    }


def tier_queries(window_ms: int) -> dict[str, str]:
    """The PromQL behind the per-tier pending maximum (tier actions) of one window."""
    r = f"[{window_ms}ms]"
    gauge = "envoy_cluster_upstream_rq_pending_active"
    by = "by (ballast_pop, ballast_cluster)"
    return {
        "pending_max": f"max {by} (max_over_time({gauge}{r}))",
        "observed_at": f"max {by} (timestamp({gauge}) and last_over_time({gauge}{r}))",
        "active": "max by (ballast_pop, ballast_cluster, instance) "
        f"(max_over_time(envoy_cluster_upstream_rq_active{r}))",
        "overloaded": f"max {by} (max_over_time(envoy_cluster_upstream_queue_overloaded{r}))",
    }


Vector = list[dict[str, Any]]


def assemble_tiers(results: dict[str, Vector]) -> TierSignals:
    """Instant vectors of `tier_queries` -> TierPending per (PoP, group) -> tier (pure).

    A tier cluster needs both its maximum and its newest sample time to be present."""
    rows: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    active: dict[tuple[str, str], list[tuple[str, float]]] = defaultdict(list)
    for name in ("pending_max", "observed_at", "overloaded", "active"):
        for labels, value in _series(results.get(name, [])):
            pop, cluster = labels.get("ballast_pop", ""), labels.get("ballast_cluster", "")
            if not pop or split_cluster(cluster) is None:
                continue
            if name == "active":
                active[pop, cluster].append((labels.get("instance", ""), value))
            else:
                rows[pop, cluster][name] = value
    signals: TierSignals = {}
    for (pop, cluster), values in sorted(rows.items()):
        split = split_cluster(cluster)
        if split is not None and "pending_max" in values and "observed_at" in values:
            signals.setdefault((pop, split[0]), {})[split[1]] = TierPending(
                pending_max=values["pending_max"],
                observed_at_ms=round(values["observed_at"] * 1000),
                active_by_node=tuple(sorted(active.get((pop, cluster), []))),
                overloaded_max=values.get("overloaded"),
            )
    return signals


def assemble(results: dict[str, Vector], endpoints: ServedEndpoints | None = None) -> Signals:
    """Instant vectors by signal -> OriginSignals per (PoP, group) -> origin (pure).

    Requests and 5xx are summed over the group's tiers (the latency buckets already merge them
    in PromQL); pending is the max over tiers and queue overflow the sum, both group-wide numbers
    every origin of the group carries. No observation in the window: p50 / p95 None, 0 samples.
    Host series that `endpoints` maps to an origin (through the desired state their PoP serves)
    replace its zone counters (module docstring).
    """
    latency = _latency(results.get("latency_buckets", []))
    per_tier: dict[tuple[str, str, str, str], dict[str, float]] = defaultdict(dict)
    for name in ("requests", "errors_5xx", "observed_at"):
        for labels, value in _series(results.get(name, [])):
            key = tuple(labels.get(label, "") for label in ZONE)
            pop, cluster, origin = key
            split = split_cluster(cluster)
            if pop and origin and split is not None:
                per_tier[pop, split[0], split[1], origin][name] = value
    pending: dict[tuple[str, str], float] = defaultdict(float)
    overflow: dict[tuple[str, str], float] = defaultdict(float)
    for name, target, combine in (
        ("pending_active", pending, max),
        ("queue_overflow", overflow, lambda a, b: a + b),
    ):
        for labels, value in _series(results.get(name, [])):
            split = split_cluster(labels.get("ballast_cluster", ""))
            pop = labels.get("ballast_pop", "")
            if split is not None and pop:
                target[pop, split[0]] = combine(target[pop, split[0]], value)
    tiers: dict[tuple[str, str, str], list[dict[str, float]]] = defaultdict(list)
    for (pop, group, _, origin), values in per_tier.items():
        if "observed_at" in values:
            tiers[pop, group, origin].append(values)
    hosts = _hosts(results, endpoints or ServedEndpoints())
    for key in hosts:
        tiers.setdefault(key, [])
    signals: Signals = {}
    for (pop, group, origin), zone_rows in sorted(tiers.items()):
        host = hosts.get((pop, group, origin))
        rows = zone_rows if host is None else [*host, *({"observed_at": row["observed_at"]}
                                                          for row in zone_rows)]
        buckets = latency.get((pop, group, origin), ())
        observed = round(buckets[-1][1]) if buckets else 0
        rank = quantile_lower_rank(observed)
        signals.setdefault((pop, group), {})[origin] = OriginSignals(
            requests=round(sum(row.get("requests", 0.0) for row in rows)),
            errors_5xx=round(sum(row.get("errors_5xx", 0.0) for row in rows)),
            connect_failures=round(sum(row.get("connect_failures", 0.0) for row in rows)),
            abandoned=round(sum(row.get("abandoned", 0.0) for row in rows)),
            p50_ms=quantile(0.5, buckets),
            p95_ms=quantile(0.95, buckets),
            pending_active=pending.get((pop, group), 0.0),
            queue_overflow=round(overflow.get((pop, group), 0.0)),
            probe_success=None,
            observed_at_ms=round(max(row["observed_at"] for row in rows) * 1000),
            latency_samples=observed,
            p95_low_ms=quantile(rank / observed, buckets) if rank else None,
        )
    return signals


def _latency(vector: Vector) -> dict[tuple[str, str, str], Buckets]:
    """The window's bucket increases -> cumulative buckets per (PoP, group, origin), bounds
    ascending, ending in +Inf (Envoy exports it). `increase()` extrapolates each bucket on its
    own, so a bucket may read a hair below the one before it: counts are made non-decreasing,
    as `histogram_quantile` does."""
    raw: dict[tuple[str, str, str], list[tuple[float, float]]] = defaultdict(list)
    for labels, value in _series(vector):
        try:
            bound = float(labels.get("le", ""))
        except ValueError:
            log.warning("latency bucket without a readable le ignored: %r", labels)
            continue
        key = tuple(labels.get(k, "") for k in QUANTILE)
        raw[key[0], key[1], key[2]].append((bound, value))
    out: dict[tuple[str, str, str], Buckets] = {}
    for key, pairs in raw.items():
        pairs.sort()
        if not math.isinf(pairs[-1][0]):
            continue  # no +Inf bucket: no count of the observations; no latency
        cumulative, top = [], 0.0
        for bound, count in pairs:
            top = max(top, count)
            cumulative.append((bound, top))
        out[key] = tuple(cumulative)
    return out


def _hosts(
    results: dict[str, Vector], endpoints: ServedEndpoints
) -> dict[tuple[str, str, str], list[dict[str, float]]]:
    """Host series -> rows per (PoP, group, origin), one per (cluster, address) seen."""
    per_host: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
    for query, name in HOST_SIGNALS.items():
        for labels, value in _series(results.get(query, [])):
            pop, cluster, address = (labels.get(k, "") for k in HOST)
            if pop and (cluster, address) in endpoints.of(pop):
                per_host[pop, cluster, address][name] = value
    hosts: dict[tuple[str, str, str], list[dict[str, float]]] = defaultdict(list)
    for (pop, cluster, address), values in per_host.items():
        if "observed_at" in values:
            failed = values.get("errors_5xx", 0.0) - values.get("connect_failures", 0.0)
            values["errors_5xx"] = max(0.0, failed)
            if "successes" in values:
                values["abandoned"] = float(abandoned_attempts(
                    values.get("requests", 0.0), values["successes"], values["errors_5xx"]))
            hosts[(pop, *endpoints.of(pop)[cluster, address])].append(values)
    return hosts


def _series(vector: Vector) -> list[tuple[dict[str, str], float]]:
    out = []
    for item in vector:
        try:
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            log.warning("unreadable Prometheus sample ignored: %r", item)
            continue
        if math.isfinite(value) and value >= 0:
            out.append((dict(item.get("metric", {})), value))
    return out


class PrometheusSource:
    """A MetricSource over a Prometheus HTTP API at `url`."""

    def __init__(self, url: str, timeout_ms: int = 5000, desired: Desired | None = None) -> None:
        self._client = PrometheusConnect(url=url, disable_ssl=True)
        self._timeout_ms = timeout_ms
        self._served = served_endpoints(desired)

    def update_served(self, desired: Desired, serving: Mapping[str, Desired]) -> None:
        """What is served changed (a reload, a rollout's look): each PoP's host series map to
        the origins of the desired state it serves from now on (`served_endpoints`)."""
        self._served = served_endpoints(desired, serving)

    def _query(self, promql: str, at_s: float) -> Vector:
        try:
            result = self._client.custom_query(
                promql, params={"time": f"{at_s:.3f}", "timeout": f"{self._timeout_ms}ms"}
            )
        except (PrometheusApiClientException, RequestException, ValueError) as err:
            raise PrometheusQueryError(f"{promql}: {err}") from err
        return result if isinstance(result, list) else []

    async def window(self, now_ms: int, window_ms: int) -> Signals:
        at_s = now_ms / 1000
        named = queries(window_ms)
        vectors = await asyncio.gather(
            *(asyncio.to_thread(self._query, promql, at_s) for promql in named.values())
        )
        # one series per (PoP, origin) and stat: a fleet's worth of parsing, off the loop too
        endpoints = self._served
        return await asyncio.to_thread(
            assemble, dict(zip(named, vectors, strict=True)), endpoints)

    async def tier_pending(self, now_ms: int, window_ms: int) -> TierSignals:
        at_s = now_ms / 1000
        named = tier_queries(window_ms)
        vectors = await asyncio.gather(
            *(asyncio.to_thread(self._query, promql, at_s) for promql in named.values())
        )
        return await asyncio.to_thread(assemble_tiers, dict(zip(named, vectors, strict=True)))
