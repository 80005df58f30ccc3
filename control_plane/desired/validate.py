"""The whole document, section by section: every check, every cross-reference, then the model.

`build_desired` reads the root node into a `Desired`, recording every problem it meets on the
way; it returns None when any was found, so a half-valid model never leaves this module. The
sections are read in order, each by its reader (`document.py` says which module holds which),
over one `Document` that carries what the earlier ones found; the small top-level sections
(`pops`, `access_log`, `rollout`) are read here.
"""

from __future__ import annotations

import yaml

from control_plane.desired.classification import read_classification
from control_plane.desired.document import Document, Files, NoFiles
from control_plane.desired.errors import Sink
from control_plane.desired.fields import Fields, did_you_mean, integer, ip_address
from control_plane.desired.filter_types import DEFAULT_ALLOWED, AllowedFilters
from control_plane.desired.grpc_services import read_grpc_services
from control_plane.desired.layers import GLOBAL, blame, read_layer
from control_plane.desired.listeners import read_listeners
from control_plane.desired.model import AccessLog, Desired, Pop, RolloutGates, RolloutPolicy
from control_plane.desired.origin_groups import read_origin_groups
from control_plane.desired.policies import (
    CATCH_ALL_ROUTE_NAME,
    check_cacheable_routes,
    check_failover,
    ramp_layer,
    read_tiers,
    tier_actions_layer,
)
from control_plane.desired.schema import (
    ACCESS_LOG_FIELDS,
    FAILOVER_FIELDS,
    ROLLOUT_FIELDS,
    ROLLOUT_GATE_FIELDS,
)
from control_plane.desired.yaml_nodes import is_null


def build_desired(root: yaml.Node, sink: Sink, digest: str, files: Files | None = None,
                  allowed_filters: AllowedFilters = DEFAULT_ALLOWED) -> Desired | None:
    """`allowed_filters`: the HTTP filter types `http_filters` may use (None: any)."""
    return _read(Document(sink, files or NoFiles(), allowed_filters), root, digest)


def _read(document: Document, root: yaml.Node, digest: str) -> Desired | None:
    doc = Fields(root, "", document.sink, " (the whole document)")
    if not doc.ok:
        return None
    document.pops = _pops(document, doc)
    read_tiers(document, doc.node_of("tiers"))
    failover = Fields(doc.node_of("failover"), "failover", document.sink)
    document.failover |= read_layer(failover, FAILOVER_FIELDS, GLOBAL)
    failover.finish()
    check_failover(document, document.failover, failover.at())
    document.tier_actions |= tier_actions_layer(document, doc, "tier_actions", GLOBAL)
    ramp = Fields(doc.node_of("standby_ramp"), "standby_ramp", document.sink)
    document.standby_ramp |= ramp_layer(document, ramp, GLOBAL)
    ramp.finish()
    access = Fields(doc.node_of("access_log"), "access_log", document.sink)
    access_log = read_layer(access, ACCESS_LOG_FIELDS, GLOBAL)
    access.finish()
    groups = read_origin_groups(document, doc)
    services = read_grpc_services(document, doc, document.groups)
    default_tier, rules, trusted = read_classification(document, doc)
    check_cacheable_routes(document, {rule.name for rule in rules} | {CATCH_ALL_ROUTE_NAME})
    listeners = read_listeners(document, doc)
    rollout = _rollout(document, doc)
    doc.finish()
    if document.sink.problems:
        return None
    return Desired(
        pops=tuple(document.pops.values()),
        origin_groups=(*(g for g in groups if g is not None), *services),
        classification=tuple(rules),
        default_tier=default_tier,
        listeners=tuple(listeners),
        trusted_priority_sources=trusted,
        access_log=AccessLog(**{k: v.value for k, v in access_log.items()}),
        rollout=rollout,
        source=document.sink.source,
        digest=digest,
        loaded_at_s=document.files.now_s,
    )


def _rollout(document: Document, doc: Fields) -> RolloutPolicy:
    """The `rollout:` section: strategy, canary PoPs (which must exist), waves, bake time
    and the gates' thresholds; every key optional."""
    fields = Fields(doc.node_of("rollout"), "rollout", document.sink)
    layer = read_layer(fields, ROLLOUT_FIELDS, GLOBAL)
    gates = Fields(fields.node_of("gates"), "rollout.gates", document.sink)
    gate_layer = read_layer(gates, ROLLOUT_GATE_FIELDS, GLOBAL)
    gates.finish()
    fields.finish()
    canary = layer.get("canary")
    if canary is not None and canary.value and "pops" not in document.broken:
        for pop in canary.value:
            if pop not in document.pops and canary.at is not None:
                document.sink.add(canary.at, f"unknown pop '{pop}'"
                                  + did_you_mean(pop, list(document.pops)))
    written = {key: located.value for key, located in layer.items()
               if located.value is not None}
    gate_values = {key: located.value for key, located in gate_layer.items()
                   if located.value is not None}
    policy = RolloutPolicy(**written, gates=RolloutGates(**gate_values))
    bake, flush = layer.get("bake_ms"), layer.get("stats_flush_interval_ms")
    if policy.strategy == "waves" and policy.bake_ms < policy.min_bake_ms:
        document.sink.add(blame(fields.at(), *(x for x in (bake, flush) if x is not None)),
                          f"bake ({policy.bake_ms / 1000:g}s) is below "
                          f"{policy.min_bake_ms / 1000:g}s, two stats flushes (Envoys flush "
                          f"every {policy.stats_flush_interval_ms / 1000:g}s, "
                          "stats_flush_interval): the first flush after a wave's ACKs still "
                          "carries traffic served on the old version, so its gate could not "
                          "judge one full flush of the change's own")
    return policy


def _pops(document: Document, doc: Fields) -> dict[str, Pop]:
    fields = Fields(doc.node_of("pops"), "pops", document.sink)
    document.note_broken(fields)
    if not doc.has("pops"):
        document.sink.add(doc.at(), "missing required key 'pops' (the edge locations, by name)")
    elif fields.ok and not fields.entries:
        document.sink.add(fields.at(), "must list at least one pop")
    pops: dict[str, Pop] = {}
    for named, node in document.named_entries(fields, "pop"):
        pop = Fields(node if not is_null(node) else None, named.at.path, document.sink)
        address = pop.read("listen_address", ip_address)
        offset = pop.read("port_offset", integer(0, 65534))
        pop.finish()
        if (pop.has("listen_address") and address is None) or (
                pop.has("port_offset") and offset is None):
            document.unsure_pops.add(named.name)
        pops[named.name] = Pop(named.name, address or "0.0.0.0", offset or 0)
    fields.finish()
    return pops
