"""The tier controller's slots in Envoy: one RTDS runtime layer per PoP, over the same ADS stream.

A tier's per-Envoy concurrency when it is not its guaranteed share (`TierActions.limits`:
borrowed slots, slots taken by preemption or taken from it, `decide/tiers.py`) becomes
runtime overrides of its cluster's circuit breakers,
`circuit_breakers.<group>.<tier>.default.max_requests` and `.max_connections`; its pending
limit bounded in time (`TierActions.pending_limits`) becomes `.max_pending_requests`. A shed
tier (`TierActions.shed`) keeps its floor (`TierActions.with_floors`): its limit is the floor
and its queue at most as long (at least one place while the floor has slots, so a pool
without a connection can still open one), so what finds the floor busy is answered at once with the
tier's `shed_action` (`overflow.py`). The Cluster (CDS) keeps the tier's guaranteed share, so
lending, preemption, shedding and their reversal never rebuild a cluster or drain its
connection pool (measured against CDS: docs/architecture.md, "Facts the code relies on",
lending by RTDS). The layer `ballast_tiers` is always served, empty when nothing is in force:
Envoys whose bootstrap names it (the edge bootstrap template) wait for it at start-up.
"""

from __future__ import annotations

from collections.abc import Mapping

from envoy.service.runtime.v3.rtds_pb2 import Runtime
from google.protobuf.struct_pb2 import Struct

from control_plane.desired.model import OriginGroup, TierActions
from control_plane.translate.clusters import cluster_name

RUNTIME_LAYER = "ballast_tiers"


def breaker_keys(cluster: str) -> tuple[str, str]:
    prefix = f"circuit_breakers.{cluster}.default"
    return f"{prefix}.max_requests", f"{prefix}.max_connections"


def pending_key(cluster: str) -> str:
    return f"circuit_breakers.{cluster}.default.max_pending_requests"


def tier_runtime(actions: Mapping[str, TierActions], groups: Mapping[str, OriginGroup]
                 ) -> Runtime:
    """The layer for one PoP (origin group -> its actions; `groups`: the groups by name): every
    limit and every pending limit in force, keys sorted."""
    values: dict[str, float] = {}
    for group, found in actions.items():
        slots = found.with_floors(groups[group])
        for tier, limit in slots.limits:
            for key in breaker_keys(cluster_name(group, tier)):
                values[key] = limit
        for tier, count in slots.pending_limits:
            values[pending_key(cluster_name(group, tier))] = count
    layer = Struct()
    layer.update(dict(sorted(values.items())))
    return Runtime(name=RUNTIME_LAYER, layer=layer)
