"""The desired-state document's shape: which keys exist, their types, ranges and defaults.

`TIER_FIELDS`, `FAILOVER_FIELDS`, `HEALTH_CHECK_FIELDS` and `TIER_ACTION_FIELDS` map each YAML
key to the model field it fills and the converter that checks it. Tiers, failover and tier actions
are layered (product defaults < the file's global block < a group's overrides); see `layers.py`.
"""

from __future__ import annotations

import itertools
from dataclasses import fields as dataclass_fields
from typing import Any

import yaml

from control_plane.desired.defaults import DEFAULT_TIERS
from control_plane.desired.fields import (
    HOSTNAME_RE,
    Bad,
    Fields,
    boolean,
    check_name,
    choice,
    duration,
    fraction,
    integer,
    number,
    path_prefix,
    percent,
    text,
)
from control_plane.desired.layers import FieldTable, Layer, Located, defaults_layer, read_layer
from control_plane.desired.model import (
    AdaptiveLifo,
    FailoverPolicy,
    HealthCheck,
    QueuePolicy,
    StandbyRampPolicy,
    Tier,
    TierActionPolicy,
)
from control_plane.desired.yaml_nodes import describe, is_null

MAX_WATERMARK = 1_000_000


def _budget(node: yaml.Node) -> float:
    """A retry budget written as a fraction or percentage, kept in percent (model's unit)."""
    return round(fraction(0, 1)(node) * 100, 6)


HEDGE_OFF = "off"
MAX_HEDGE_DELAY_MS = 60_000


def _hedge_delay(node: yaml.Node) -> int:
    """`off` (0) or a duration 1ms..60s."""
    if isinstance(node, yaml.ScalarNode) and node.value == HEDGE_OFF:
        return 0
    try:
        return duration(1, MAX_HEDGE_DELAY_MS)(node)
    except Bad as bad:
        raise Bad(f"{bad} (or {HEDGE_OFF})") from None


TIER_FIELDS: FieldTable = {
    "priority": ("priority", integer(0, 1000)),
    "share": ("share_percent", percent(1, 100)),
    "max_queue_depth": ("max_queue_depth", integer(0, 1_000_000)),
    "queue_timeout": ("queue_timeout_ms", duration()),
    "connect_timeout": ("connect_timeout_ms", duration()),
    "read_timeout": ("read_timeout_ms", duration()),
    "retries": ("retries", integer(0, 10)),
    "sheddable": ("sheddable", boolean),
    "retry_budget": ("retry_budget_percent", _budget),
    "shed_action": ("shed_action", choice("reject", "defer", "stale")),
    "hedge_delay": ("hedge_delay_ms", _hedge_delay),
}
TIER_REQUIRED = ("priority", "share", "max_queue_depth", "queue_timeout", "connect_timeout",
                 "read_timeout", "retries")
QUEUE_KINDS = ("fifo", "adaptive_lifo")

# flap damping's knobs (decide/damping.py), the same for origins (failover) and tier actions
DAMPING_FIELDS: FieldTable = {
    "damping_penalty": ("damping_penalty", integer(0, 100_000)),
    "damping_half_life": ("damping_half_life_ms", duration(1000, 86_400_000)),
    "damping_suppress": ("damping_suppress", integer(1, 1_000_000)),
    "damping_reuse": ("damping_reuse", integer(0, 1_000_000)),
    "damping_return_windows": ("damping_return_windows", integer(1, 100)),
}

FAILOVER_FIELDS: FieldTable = {
    "mode": ("mode", choice("health_proportional", "linear", "exponential")),
    "interval": ("interval_ms", duration(1000, 3_600_000)),
    "window": ("window_ms", duration(1000, 3_600_000)),
    "shift_step": ("shift_step", percent(1, 100)),
    "max_step": ("max_step", percent(1, 15)),
    "hysteresis": ("hysteresis", percent(0, 50)),
    "jitter": ("jitter", percent(0, 10)),
    "min_warm_pool": ("min_warm_pool", percent(0, 50)),
    "error_rate_threshold": ("error_rate_threshold", fraction(0, 1)),
    "p95_threshold": ("p95_threshold_ms", duration()),
    "breach_windows": ("breach_windows", integer(1, 100)),
    "return_healthy_windows": ("return_healthy_windows", integer(1, 100)),
    "return_p50": ("return_p50_ms", duration()),
    "return_speed": ("return_speed", number(0.01, 1)),
    "stale_after": ("stale_after_ms", duration(1000, 86_400_000)),
    "min_samples": ("min_samples", integer(1, 1_000_000)),
    "abandon_threshold": ("abandon_threshold", fraction(0, 1)),
    "compare_margin": ("compare_margin", number(0, 1)),
    **DAMPING_FIELDS,
}

MAX_RAMP_STEPS = 10


def ramp_schedule(node: yaml.Node) -> tuple[int, ...]:
    """The standby's share ceilings, e.g. [5, 10, 20, 40]: 1 to 10 percents, strictly rising."""
    if not isinstance(node, yaml.SequenceNode) or not 1 <= len(node.value) <= MAX_RAMP_STEPS:
        raise Bad(f"must be a list of 1 to {MAX_RAMP_STEPS} percents, e.g. [5, 10, 20, 40]")
    ceilings = tuple(percent(1, 100)(item) for item in node.value)
    if any(b <= a for a, b in itertools.pairwise(ceilings)):
        raise Bad(f"must be strictly rising, got {list(ceilings)}")
    return ceilings


MAX_CACHEABLE_ROUTES = 1000


def route_names(node: yaml.Node) -> tuple[str, ...]:
    """Route names: classification rule names or `default` (the catch-all); checked later."""
    if not isinstance(node, yaml.SequenceNode) or len(node.value) > MAX_CACHEABLE_ROUTES:
        raise Bad(f"must be a list of at most {MAX_CACHEABLE_ROUTES} route names "
                  "(classification rule names or default)")
    names = tuple(text(item) for item in node.value)
    for value in names:
        check_name(value, "route")
    return names


STANDBY_RAMP_FIELDS: FieldTable = {
    "enabled": ("enabled", boolean),
    "schedule": ("schedule", ramp_schedule),
    "cold_after": ("cold_after_ms", duration(0, 86_400_000)),
    "on_degrade": ("on_degrade", choice("back_off", "hold")),
    "mirror_percent": ("mirror_percent", number(0, 100)),
    "cacheable_routes": ("cacheable_routes", route_names),
}

HEALTH_CHECK_FIELDS: FieldTable = {
    "interval": ("interval_ms", duration(100, 3_600_000)),
    "connect_timeout": ("connect_timeout_ms", duration()),
    "read_timeout": ("read_timeout_ms", duration()),
    "cacheable_path": ("cacheable_path", path_prefix),
    "uncacheable_path": ("uncacheable_path", path_prefix),
    "expected_status": ("expected_status", integer(100, 599)),
}


TIER_ACTION_FIELDS: FieldTable = {
    "enabled": ("enabled", boolean),
    "trigger": ("trigger", choice("wait", "pending")),
    "trigger_wait": ("trigger_wait_ms", duration(1, 600_000)),
    "trigger_wait_quantile": ("trigger_wait_quantile", choice("p50", "p95", "p99")),
    "trigger_wait_min_samples": ("trigger_wait_min_samples", integer(2, 1_000_000)),
    "trigger_pending": ("trigger_pending", integer(0, 1_000_000)),
    "for": ("for_ms", duration(0, 3_600_000)),
    "shed_threshold": ("shed_threshold", fraction(0.01, 1)),
    "shed_lift_threshold": ("shed_lift_threshold", fraction(0, 1)),
    "lending": ("lending", boolean),
    "lend_headroom": ("lend_headroom_percent", percent(0, 100)),
    "lend_step": ("lend_step_percent", percent(0, 100)),
    "demote_share": ("demote_share", percent(0, 100)),
    "recover_after": ("recover_after_ms", duration(0, 3_600_000)),
    "stale_after": ("stale_after_ms", duration(1000, 86_400_000)),
    "compare_margin": ("compare_margin", number(0, 1)),
    **DAMPING_FIELDS,
}
MAX_WAVES = 10


def rollout_waves(node: yaml.Node) -> tuple[int, ...]:
    """The waves after the canary, as cumulative percents of the other PoPs: 1 to 10 percents,
    strictly rising, the last 100 (every PoP is reached), e.g. [50%, 100%]."""
    if not isinstance(node, yaml.SequenceNode) or not 1 <= len(node.value) <= MAX_WAVES:
        raise Bad(f"must be a list of 1 to {MAX_WAVES} percents of the PoPs after the canary, "
                  "cumulative, e.g. [50%, 100%]")
    waves = tuple(percent(1, 100)(item) for item in node.value)
    if any(b <= a for a, b in itertools.pairwise(waves)):
        raise Bad(f"must rise wave by wave, got {list(waves)}")
    if waves[-1] != 100:
        raise Bad(f"must end at 100% (the last wave reaches every PoP), got {list(waves)}")
    return waves


MAX_CANARY_POPS = 100


def pop_names(node: yaml.Node) -> tuple[str, ...]:
    """A list of PoP names (whether each exists is checked later), e.g. [fra]."""
    if not isinstance(node, yaml.SequenceNode) or not 1 <= len(node.value) <= MAX_CANARY_POPS:
        raise Bad(f"must be a list of 1 to {MAX_CANARY_POPS} PoP names, e.g. [fra]")
    names = tuple(text(item) for item in node.value)
    for value in names:
        check_name(value, "pop")
    if len(set(names)) != len(names):
        raise Bad(f"lists a PoP twice: {list(names)}")
    return names


ROLLOUT_FIELDS: FieldTable = {
    "strategy": ("strategy", choice("waves", "immediate")),
    "canary": ("canary", pop_names),
    "waves": ("waves", rollout_waves),
    "bake": ("bake_ms", duration(1000, 86_400_000)),
    "renewals": ("renewals", choice("immediate", "waves")),
    "stats_flush_interval": ("stats_flush_interval_ms", duration(100, 3_600_000)),
}

ROLLOUT_GATE_FIELDS: FieldTable = {
    "max_5xx_increase": ("max_5xx_increase", fraction(0, 1)),
    "max_p95_ratio": ("max_p95_ratio", number(1, 100)),
    "min_p95_increase": ("min_p95_increase_ms", duration(0, 600_000)),
    "max_shed_increase": ("max_shed_increase", fraction(0, 1)),
    "max_tier_action_onsets": ("max_tier_action_onsets", integer(0, 1000)),
    "ack_timeout": ("ack_timeout_ms", duration(1000, 3_600_000)),
    "min_samples": ("min_samples", integer(1, 1_000_000)),
    "evidence_timeout": ("evidence_timeout_ms", duration(0, 86_400_000)),
}

ACCESS_LOG_FIELDS: FieldTable = {
    "sample_rate": ("sample_rate", fraction(0, 1)),
}

# Keys naming a tier (or `none`); left out, they are chosen by priority for each group.
TIER_ACTION_TIERS: dict[str, str] = {
    "trigger_tier": "trigger_tier",
    "demote": "demote_tier",
    "demote_to": "demote_to",
    "shed": "shed_tier",
}
NO_TIER = "none"


def _dataclass_values(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclass_fields(obj)}


FAILOVER_DEFAULTS: Layer = defaults_layer(_dataclass_values(FailoverPolicy()))
STANDBY_RAMP_DEFAULTS: Layer = defaults_layer(_dataclass_values(StandbyRampPolicy()))
HEALTH_CHECK_DEFAULTS: Layer = defaults_layer(_dataclass_values(HealthCheck()))
TIER_ACTION_DEFAULTS: Layer = defaults_layer({
    key: value for key, value in _dataclass_values(TierActionPolicy()).items()
    if key not in TIER_ACTION_TIERS.values()
})


def tier_or_none(node: yaml.Node) -> str:
    """A tier name, or `none` (that action is off); whether the tier exists is checked later."""
    value = text(node)
    if value != NO_TIER:
        check_name(value, "tier")
    return value


def tier_defaults(tier: Tier) -> Layer:
    values = _dataclass_values(tier)
    del values["name"]
    policy = values.pop("queue_policy")
    values |= {
        "queue_policy": policy.kind,
        "high_watermark": policy.adaptive_lifo.high_watermark,
        "low_watermark": policy.adaptive_lifo.low_watermark,
    }
    return defaults_layer(values)


DEFAULT_TIER_LAYERS: dict[str, Layer] = {t.name: tier_defaults(t) for t in DEFAULT_TIERS}
NEW_TIER_DEFAULTS: Layer = defaults_layer({
    "sheddable": False,
    "shed_action": "reject",
    "retry_budget_percent": 15.0,
    "hedge_delay_ms": 0,
    "queue_policy": QueuePolicy().kind,
    "high_watermark": AdaptiveLifo().high_watermark,
    "low_watermark": AdaptiveLifo().low_watermark,
})


def read_tier_layer(fields: Fields, layer: int) -> Layer:
    """One tier's fields as written, its queue policy flattened into three entries."""
    result = read_layer(fields, TIER_FIELDS, layer)
    policy_node = fields.node_of("queue_policy")
    if policy_node is not None:
        result |= _read_queue_policy(policy_node, fields, layer)
    return result


def _read_queue_policy(node: yaml.Node, parent: Fields, layer: int) -> Layer:
    """`fifo`, `adaptive_lifo`, `{fifo: {}}` or `{adaptive_lifo: {high_watermark: ..., ...}}`."""
    path = f"{parent.path}.queue_policy"
    if isinstance(node, yaml.ScalarNode):
        kind = parent.convert(node, path, choice(*QUEUE_KINDS))
        return {"queue_policy": Located(kind, parent.at("queue_policy"), layer)}
    policy = Fields(node, path, parent.sink, " or one of fifo, adaptive_lifo")
    written = [k for k in QUEUE_KINDS if policy.has(k)]
    if policy.ok and len(written) != 1:
        parent.sink.add(policy.at(), "must name exactly one policy: fifo or adaptive_lifo")
    result: Layer = {}
    if policy.has("fifo"):
        fifo = policy.node_of("fifo")
        Fields(None if is_null(fifo) else fifo, f"{path}.fifo", parent.sink).finish()
        result["queue_policy"] = Located("fifo", policy.at("fifo"), layer)
    lifo_node = policy.node_of("adaptive_lifo")
    if lifo_node is not None and len(written) == 1:
        lifo = Fields(None if is_null(lifo_node) else lifo_node, f"{path}.adaptive_lifo",
                      parent.sink)
        at = policy.at("adaptive_lifo")
        result["queue_policy"] = Located("adaptive_lifo", at, layer)
        for key in ("high_watermark", "low_watermark"):
            if lifo.has(key):
                low = 1 if key == "high_watermark" else 0
                result[key] = Located(lifo.read(key, integer(low, MAX_WATERMARK)), at, layer)
        lifo.finish()
    policy.finish()
    return result


def build_tier(name: str, layer: Layer) -> Tier:
    values = {key: located.value for key, located in layer.items()}
    policy = QueuePolicy(
        kind=values.pop("queue_policy"),
        adaptive_lifo=AdaptiveLifo(values.pop("high_watermark"), values.pop("low_watermark")),
    )
    return Tier(name=name, queue_policy=policy, **values)


def build_from_layer(cls: type[Any], layer: Layer) -> Any:
    return cls(**{key: located.value for key, located in layer.items()})


def domain(node: yaml.Node) -> str:
    """A virtual host domain: `*`, `shop.example.com`, `*.example.com`, `api.example.*`..."""
    value = text(node).strip().lower()
    if any(c.isspace() for c in value) or value.count("*") > 1:
        raise Bad(f"must be a domain like shop.example.com, *.example.com or '*', got {value!r}")
    return value


def server_name(node: yaml.Node) -> str:
    """A TLS server name a certificate is served for: `shop.example.com` or `*.example.com`."""
    value = text(node).strip().lower()
    bare = value[2:] if value.startswith("*.") else value
    if not HOSTNAME_RE.fullmatch(bare) or "*" in bare:
        raise Bad(f"must be a hostname like shop.example.com or *.example.com, got {value!r}")
    return value


def alpn(node: yaml.Node) -> tuple[str, ...]:
    """The protocols offered to clients, most preferred first: h2 and/or http/1.1."""
    if not isinstance(node, yaml.SequenceNode) or not 1 <= len(node.value) <= 2:
        raise Bad("must be a list like [h2, http/1.1]")
    values = tuple(choice("h2", "http/1.1")(item) for item in node.value)
    if len(set(values)) != len(values):
        raise Bad(f"lists a protocol twice: {list(values)}")
    return values


def tls_version(node: yaml.Node) -> str:
    """`1.2` or `1.3` (written as a number or a string)."""
    if not isinstance(node, yaml.ScalarNode) or str(node.value) not in ("1.2", "1.3"):
        raise Bad(f"must be 1.2 or 1.3, got {describe(node)}")
    return str(node.value)


LISTENER_TLS_FIELDS: FieldTable = {
    "min_version": ("min_version", tls_version),
    "max_version": ("max_version", tls_version),
    "cipher_policy": ("cipher_policy", choice("intermediate", "modern")),
    "alpn": ("alpn", alpn),
    "expiry_warning_days": ("expiry_warning_days", integer(0, 365)),
}
