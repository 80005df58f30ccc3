"""`tiers`, `failover`, `tier_actions` and `standby_ramp`: the policies every origin group
inherits (global, then the group's own layer over it) and their cross-checks."""

from __future__ import annotations

import yaml

from control_plane.desired.document import Document, quoted
from control_plane.desired.errors import At
from control_plane.desired.fields import Fields, did_you_mean
from control_plane.desired.layers import GLOBAL, GROUP, Layer, Located, blame, known, read_layer
from control_plane.desired.model import TierActionPolicy
from control_plane.desired.schema import (
    DEFAULT_TIER_LAYERS,
    NEW_TIER_DEFAULTS,
    NO_TIER,
    STANDBY_RAMP_FIELDS,
    TIER_ACTION_FIELDS,
    TIER_ACTION_TIERS,
    TIER_REQUIRED,
    read_tier_layer,
    tier_or_none,
)

CATCH_ALL_ROUTE_NAME = "default"  # the route of unmatched requests (translate/routes.py)


def ramp_layer(document: Document, fields: Fields, layer: int) -> Layer:
    result = read_layer(fields, STANDBY_RAMP_FIELDS, layer)
    if "cacheable_routes" in result:
        document.cacheable_routes.append(result["cacheable_routes"])
    return result


def check_cacheable_routes(document: Document, routes: set[str]) -> None:
    for written in document.cacheable_routes:
        for route in written.value or ():
            if route not in routes and written.at is not None:
                document.sink.add(written.at, f"unknown route '{route}' (classification rule "
                                  f"names or {CATCH_ALL_ROUTE_NAME})" + did_you_mean(route, routes))


def read_tiers(document: Document, node: yaml.Node | None) -> None:
    if node is None:
        document.tier_layers = {name: dict(layer) for name, layer in DEFAULT_TIER_LAYERS.items()}
        return
    fields = Fields(node, "tiers", document.sink)
    document.note_broken(fields)
    document.tiers_at = fields.at()
    if fields.ok and not fields.entries:
        document.sink.add(fields.at(), "must list at least one tier (or leave tiers out for "
                          "the defaults critical, normal, background)")
    for named, tier_node in document.named_entries(fields, "tier"):
        tier = Fields(tier_node, named.at.path, document.sink)
        base = DEFAULT_TIER_LAYERS.get(named.name)
        if base is None:
            missing = [key for key in TIER_REQUIRED if not tier.has(key)]
            if tier.ok and missing:
                document.sink.add(tier.at(), f"missing required key(s) {quoted(missing)} (only "
                                  "the default tiers critical, normal, background have defaults)")
            base = NEW_TIER_DEFAULTS
        document.tier_layers[named.name] = base | read_tier_layer(tier, GLOBAL)
        tier.finish()
    fields.finish()
    check_tiers(document, document.tier_layers, document.tiers_at, None)


def check_tiers(document: Document, layers: dict[str, Layer], set_at: At,
                concurrency: Located | None) -> None:
    """Shares sum to 100, priorities differ, watermarks are ordered, each tier gets a pool."""
    shares = [layer["share_percent"] for layer in layers.values() if "share_percent" in layer]
    if shares and len(shares) == len(layers) and known(*shares):
        total = sum(s.value for s in shares)
        if total != 100:
            parts = " + ".join(f"{n} {lay['share_percent'].value}" for n, lay in layers.items())
            at = set_at if _layer_of(shares) == GROUP else document.tiers_at
            document.sink.add(at, f"tier shares must sum to 100, got {total} ({parts})")
    seen: dict[int, str] = {}
    for tier_name, layer in layers.items():
        priority = layer.get("priority")
        if priority is not None and known(priority):
            if priority.value in seen:
                document.sink.add(blame(set_at, priority), f"tiers '{seen[priority.value]}' and "
                                  f"'{tier_name}' both have priority {priority.value}; "
                                  "priorities must differ")
            seen.setdefault(priority.value, tier_name)
        _check_hedging(document, tier_name, layer, set_at)
        high, low = layer["high_watermark"], layer["low_watermark"]
        if known(high, low) and low.value >= high.value:
            document.sink.add(blame(set_at, high, low), f"low_watermark ({low.value}) must be "
                              f"below high_watermark ({high.value})")
        share = layer.get("share_percent")
        if concurrency is not None and share is not None and known(share, concurrency):
            connections = share.value * concurrency.value // 100
            if connections < 1:
                document.sink.add(blame(set_at, share, concurrency),
                                  f"tier '{tier_name}' gets {share.value}% of "
                                  f"max_origin_concurrency {concurrency.value} = 0 connections; "
                                  "raise the share or max_origin_concurrency")


def _check_hedging(document: Document, tier_name: str, layer: Layer, set_at: At) -> None:
    """A hedge is a retry (it needs one left) sent before the attempt's read timeout."""
    hedge = layer.get("hedge_delay_ms")
    if hedge is None or not known(hedge) or not hedge.value:
        return
    retries, read = layer.get("retries"), layer.get("read_timeout_ms")
    if retries is not None and known(retries) and retries.value < 1:
        document.sink.add(blame(set_at, hedge, retries), f"tier '{tier_name}' hedges "
                          "(hedge_delay) but has retries: 0; a hedge is one of the tier's "
                          "retries, so it needs retries of at least 1")
    if read is not None and known(read) and hedge.value >= read.value:
        document.sink.add(blame(set_at, hedge, read), f"hedge_delay ({hedge.value} ms) of tier "
                          f"'{tier_name}' must be below its read_timeout ({read.value} ms)")


def check_failover(document: Document, layer: Layer, fallback: At, group: str = "",
                   origins: int = 0) -> None:
    step, cap = layer["shift_step"], layer["max_step"]
    if known(step, cap) and step.value > cap.value:
        document.sink.add(blame(fallback, step, cap), f"shift_step ({step.value}) must not "
                          f"exceed max_step ({cap.value})")
    reuse, suppress = layer["damping_reuse"], layer["damping_suppress"]
    if known(reuse, suppress) and reuse.value >= suppress.value:
        document.sink.add(blame(fallback, reuse, suppress), f"damping_reuse ({reuse.value}) must "
                          f"be below damping_suppress ({suppress.value})")
    warm = layer["min_warm_pool"]
    if origins > 1 and known(warm) and warm.value * (origins - 1) >= 100:
        document.sink.add(blame(fallback, warm), f"min_warm_pool ({warm.value}) x "
                          f"{origins - 1} standby origins of group '{group}' = "
                          f"{warm.value * (origins - 1)}% leaves nothing for the preferred "
                          "origin; it must stay below 100")


def tier_actions_layer(document: Document, parent: Fields, path: str, layer: int) -> Layer:
    """A `tier_actions` block as written: its fields and the tier names (or `none`)."""
    fields = Fields(parent.node_of("tier_actions"), path, document.sink)
    result = read_layer(fields, TIER_ACTION_FIELDS, layer)
    for key, field_name in TIER_ACTION_TIERS.items():
        if fields.has(key):
            result[field_name] = Located(fields.read(key, tier_or_none), fields.at(key), layer)
    fields.finish()
    return result


def resolve_tier_actions(document: Document, layer: Layer, tiers: dict[str, Layer], fallback: At
) -> TierActionPolicy | None:
    """Tier names left out are chosen by priority: the trigger is the most critical tier;
    the second is demoted to the least critical (with three tiers or more), which is shed
    when it is sheddable. Written names must be tiers of the group that fit their role."""
    priorities = {name: tier["priority"].value for name, tier in tiers.items()
                  if "priority" in tier and known(tier["priority"])}
    if len(priorities) != len(tiers) or not tiers or "tiers" in document.broken:
        return None  # the tier set's own problems are reported already
    by_priority = sorted(priorities, key=lambda name: priorities[name])
    last = tiers[by_priority[-1]]
    defaults = {
        "trigger_tier": by_priority[0],
        "demote_tier": by_priority[1] if len(by_priority) >= 3 else None,
        "demote_to": by_priority[-1] if len(by_priority) >= 3 else None,
        "shed_tier": by_priority[-1] if len(by_priority) >= 2 and known(
            last["sheddable"]) and last["sheddable"].value else None,
    }
    names: dict[str, str | None] = {}
    ok = True
    for field_name, default in defaults.items():
        written = layer.get(field_name)
        if written is None:
            names[field_name] = default
            continue
        if written.value is None:
            ok = False
            continue
        name_value = None if written.value == NO_TIER else written.value
        if name_value is not None and name_value not in tiers:
            document.sink.add(blame(fallback, written), f"unknown tier '{name_value}'"
                              + did_you_mean(name_value, list(tiers)))
            ok = False
        names[field_name] = name_value
    if not ok or not known(*layer.values()):
        return None
    if names["demote_tier"] is None:
        names["demote_to"] = None
    trigger = names["trigger_tier"]
    if not _check_tier_roles(document, names, layer, tiers, fallback) or trigger is None:
        return None
    values = {key: located.value for key, located in layer.items()
              if key not in TIER_ACTION_TIERS.values()}
    return TierActionPolicy(trigger_tier=trigger, demote_tier=names["demote_tier"],
                            demote_to=names["demote_to"], shed_tier=names["shed_tier"],
                            **values)


def _check_tier_roles(document: Document, names: dict[str, str | None], layer: Layer,
                      tiers: dict[str, Layer], fallback: At) -> bool:
    """Demotion goes to a less critical tier; the trigger tier is never demoted or shed;
    only a sheddable tier is shed."""
    problems_before = len(document.sink.problems)

    def at(*keys: str) -> At:
        return blame(fallback, *(layer[k] for k in keys if k in layer))

    trigger, demote, to, shed = (names[k] for k in
                                 ("trigger_tier", "demote_tier", "demote_to", "shed_tier"))
    if trigger is None:
        document.sink.add(at("trigger_tier"), "trigger_tier cannot be none; set enabled: false "
                          "to turn tier actions off")
    if demote is not None and to is None:
        document.sink.add(at("demote_tier", "demote_to"), f"demote '{demote}' needs demote_to, "
                          "the less critical tier whose cluster takes the demoted share")
    elif demote is not None and to is not None:
        low, high = tiers[demote]["priority"].value, tiers[to]["priority"].value
        if high <= low:
            document.sink.add(at("demote_tier", "demote_to"), f"demote_to '{to}' (priority "
                              f"{high}) must be less critical than demote '{demote}' "
                              f"(priority {low})")
    if trigger is not None and trigger in (demote, shed):
        document.sink.add(at("trigger_tier", "demote_tier", "shed_tier"), f"the trigger tier "
                          f"'{trigger}' cannot also be demoted or shed")
    high, low = layer.get("shed_threshold"), layer.get("shed_lift_threshold")
    if high is not None and low is not None and known(high, low) and low.value >= high.value:
        document.sink.add(at("shed_lift_threshold", "shed_threshold"), f"shed_lift_threshold "
                          f"{low.value:g} must be below shed_threshold {high.value:g} (hysteresis)")
    if shed is not None:
        sheddable = tiers[shed]["sheddable"]
        if known(sheddable) and not sheddable.value:
            document.sink.add(at("shed_tier"), f"tier '{shed}' is not sheddable; only a tier "
                              "with sheddable: true may be shed")
    return len(document.sink.problems) == problems_before


def _layer_of(values: list[Located]) -> int:
    return max((v.layer for v in values), default=GLOBAL)
