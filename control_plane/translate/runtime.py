"""The tier controller's lending in Envoy: one RTDS runtime layer per PoP, over the same ADS stream.

A tier's pending limit bounded in time (`TierActions.pending_limits`, `decide/tiers.py` part 4)
becomes `circuit_breakers.<group>.<tier>.default.max_pending_requests`. A borrowing tier's
per-Envoy concurrency (`TierActions.limits`) becomes runtime overrides of its
cluster's circuit breakers, `circuit_breakers.<group>.<tier>.default.max_requests` and
`.max_connections`; the Cluster (CDS) keeps the tier's guaranteed share, so lending and reclaim
never rebuild a cluster or drain its connection pool (measured against CDS: docs/architecture.md,
"Facts the code relies on", lending by RTDS). The
layer `ballast_tiers` is always served, empty when nothing is lent: Envoys whose bootstrap names
it (the edge bootstrap template) wait for it at start-up.
"""

from __future__ import annotations

from collections.abc import Mapping

from envoy.service.runtime.v3.rtds_pb2 import Runtime
from google.protobuf.struct_pb2 import Struct

from control_plane.desired.model import TierActions
from control_plane.translate.clusters import cluster_name

RUNTIME_LAYER = "ballast_tiers"


def breaker_keys(cluster: str) -> tuple[str, str]:
    prefix = f"circuit_breakers.{cluster}.default"
    return f"{prefix}.max_requests", f"{prefix}.max_connections"


def pending_key(cluster: str) -> str:
    return f"circuit_breakers.{cluster}.default.max_pending_requests"


def tier_runtime(actions: Mapping[str, TierActions]) -> Runtime:
    """The layer for one PoP (origin group -> its actions): every lent limit and every pending
    limit that bounds a queue in time, keys sorted."""
    values: dict[str, float] = {}
    for group, found in actions.items():
        for tier, limit in found.limits:
            for key in breaker_keys(cluster_name(group, tier)):
                values[key] = limit
        for tier, pending in found.pending_limits:
            values[pending_key(cluster_name(group, tier))] = pending
    layer = Struct()
    layer.update(dict(sorted(values.items())))
    return Runtime(name=RUNTIME_LAYER, layer=layer)
