"""What the dashboard's pages show, as JSON-ready dicts: pure functions of what the server holds.

- ``overview``: one card per PoP (nodes with sync state, Envoy versions, the NACKed ones with
  their last message; groups away from their home weights; active tier actions), the
  desired-state version in force and the last ``config_applied`` / ``config_rejected``.
  Its size grows with PoPs and groups away from home, not with nodes or the log.
- ``pop_view``: one PoP's nodes (`NodeRegistry.statuses(pop)`) in full and every group's
  weights, home and tier actions.
- ``timeline``: one (PoP, group)'s weights and health scores over a range, from the decision
  records of that range, with the thresholds to draw as reference lines.
- ``ramp_view``: the failover ramp of one (PoP, group) in words, from its state and the ramp
  records of the range.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from control_plane.ads.nodes import NodeStatus, PopCensus
from control_plane.decide.health import ZERO_AT_RATIO
from control_plane.decisions.explain import describe_active
from control_plane.decisions.log import format_time
from control_plane.decisions.read import Record
from control_plane.desired.model import Desired, OriginGroup, TierActions

STATUSES = ("SYNCED", "STALE", "NACKED")
NODES_LISTED_PER_POP = 5
NACKED_LISTED_PER_POP = 5
AWAY_LISTED_PER_POP = 20
SCORE_AT_THRESHOLD = 1 - 1 / ZERO_AT_RATIO  # a signal exactly at its threshold scores this
RAMP = "Failover ramp"  # the controller panel `ramp_view` words

# PoP -> group -> origin -> weight; in `overview`, pairs left out are at their home weights
Weights = Mapping[str, Mapping[str, Mapping[str, int]]]
Actions = Mapping[str, Mapping[str, TierActions]]  # PoP -> group -> active tier actions


def _last_nack(node: NodeStatus) -> dict[str, Any] | None:
    nacks = [
        {"type": t.type, "version": t.last_nack.version, "message": t.last_nack.message,
         "at": t.last_nack.at}
        for t in node.types if t.last_nack is not None
    ]
    return max(nacks, key=lambda n: n["at"]) if nacks else None


def node_summary(node: NodeStatus) -> dict[str, Any]:
    return {
        "node_id": node.node_id,
        "envoy_version": node.envoy_version,
        "status": node.status,
        "mode": node.mode,
        "types": {t.type.rsplit(".", 1)[-1]: t.status for t in node.types},
        "last_nack": _last_nack(node),
    }


def actions_json(actions: TierActions) -> dict[str, Any]:
    data = actions.to_dict()
    return {**data, "description": describe_active(data)}


def _config_record(record: Record | None) -> dict[str, Any] | None:
    if record is None:
        return None
    keep = ("seq", "time", "kind", "config_version", "rule", "detail")
    return {key: record.get(key) for key in keep}


def overview(
    desired: Desired,
    census: Mapping[str, PopCensus],
    weights: Weights,
    actions: Actions,
    config: Mapping[str, Record | None],
) -> dict[str, Any]:
    """``census``: `NodeRegistry.census(NODES_LISTED_PER_POP, NACKED_LISTED_PER_POP)`."""
    pops = []
    for pop in sorted({*desired.pop_names, *census}):
        nodes = census.get(pop)
        counts: Counter[tuple[str, str]] = Counter() if nodes is None else nodes.by_status_version
        statuses: Counter[str] = Counter()
        versions: Counter[str] = Counter()
        for (status, version), streams in counts.items():
            statuses[status] += streams
            versions[version] += streams
        away = []
        for group in desired.origin_groups if pop in desired.pop_names else ():
            current = weights.get(pop, {}).get(group.name)
            if current and current != group.home_weights(pop):
                away.append({"group": group.name, "weights": dict(current)})
        pop_actions = actions.get(pop, {})
        pops.append({
            "name": pop,
            "known": pop in desired.pop_names,
            "node_count": sum(statuses.values()),
            "by_status": {name: statuses.get(name, 0) for name in STATUSES},
            "envoy_versions": dict(sorted(versions.items())),
            "nodes": [] if nodes is None else [node_summary(n) for n in nodes.listed],
            "nacked": [] if nodes is None else [node_summary(n) for n in nodes.nacked],
            "groups": len(desired.origin_groups) if pop in desired.pop_names else 0,
            "away_count": len(away),
            "away": away[:AWAY_LISTED_PER_POP],
            "tier_actions": {g: actions_json(a) for g, a in sorted(pop_actions.items())},
        })
    return {
        "desired": {"source": desired.source, "digest": desired.digest,
                    "version": desired.digest[:16]},
        "config": {kind: _config_record(record) for kind, record in config.items()},
        "pops": pops,
    }


def pop_view(
    desired: Desired, pop: str, nodes: list[NodeStatus], weights: Weights, actions: Actions
) -> dict[str, Any]:
    members = sorted(nodes, key=lambda n: (n.node_id, n.stream))
    groups = []
    for group in desired.origin_groups:
        active = actions.get(pop, {}).get(group.name)
        current = dict(weights.get(pop, {}).get(group.name, {}))
        groups.append({
            "name": group.name,
            "weights": current,
            "home": group.home_weights(pop),
            "away": bool(current) and current != group.home_weights(pop),
            "tier_actions": None if active is None else actions_json(active),
        })
    return {
        "pop": pop,
        "nodes": [{**node_summary(n), "connected_since": n.connected_since,
                   "capability_key": n.capability_key} for n in members],
        "groups": groups,
    }


def _point(record: Record) -> dict[str, Any]:
    inputs = record.get("inputs") or {}
    scores = {
        origin: score.get("composite")
        for origin, score in (inputs.get("scores") or {}).items()
        if isinstance(score, dict)
    }
    detail = record.get("detail") or {}
    return {
        "seq": record["seq"],
        "time": record["time"],
        "kind": record["kind"],
        "weights": record.get("weights_after"),
        "scores": scores,
        "rule": record.get("rule"),
        "next": detail.get("next") if isinstance(detail, dict) else None,
    }


def timeline(
    desired: Desired,
    pop: str,
    group: OriginGroup,
    records: list[Record],
    current: Mapping[str, int],
    start: datetime,
    end: datetime,
    *,
    truncated: bool,
) -> dict[str, Any]:
    """Weights start at the first record's ``weights_before`` (or now's, without records) and
    follow every record that carries ``weights_after`` (controller steps, ramps, whatever
    decides weights); records without weights are markers only."""
    policy = group.failover
    points = [_point(r) for r in records if r.get("weights_after")]
    markers = [_point(r) for r in records if not r.get("weights_after")]
    first = next((r for r in records if r.get("weights_before")), None)
    return {
        "pop": pop,
        "group": group.name,
        "start": format_time(start),
        "end": format_time(end),
        "origins": list(group.preference[pop]),
        "home": group.home_weights(pop),
        "current": dict(current),
        "initial": dict(first["weights_before"]) if first is not None else dict(current),
        "points": points,
        "markers": markers,
        "truncated": truncated,
        "thresholds": {
            "min_warm_pool": policy.min_warm_pool,
            "score_at_threshold": SCORE_AT_THRESHOLD,
            "error_rate": policy.error_rate_threshold,
            "p95_ms": policy.p95_threshold_ms,
            "return_p50_ms": policy.return_p50_ms,
            "breach_windows": policy.breach_windows,
            "return_healthy_windows": policy.return_healthy_windows,
        },
        "config_version": desired.digest[:16],
    }


def ramp_view(group: OriginGroup, state: Mapping[str, Any], records: list[Record],
              weights: Mapping[str, int]) -> dict[str, Any]:
    """The failover ramp of one (PoP, group) (`state`: `RampState.to_dict`) in words, one entry
    per ramping standby: its stage of the schedule and the share that stage allows, its weight
    now, since when it ramps (the record that started it: the newest one of `records` — the
    pair's, oldest first — that took it from not ramping to ramping) and why it is where
    it is (the newest ramp record that has it ramping: its rule and what comes next)."""
    schedule = group.standby_ramp.schedule
    ramp_records = [r for r in records if str(r.get("kind", "")).startswith("ramp_")]
    standbys = []
    for origin, index in sorted(dict(state.get("ramps") or {}).items()):
        if not 0 <= index < len(schedule):
            continue
        holding = [r for r in ramp_records if origin in _ramps(r.get("detail"), "state")]
        started = [r for r in holding
                   if origin not in _ramps(r.get("inputs"), "state_before")]
        since = started[-1]["time"] if started else None
        last = holding[-1] if holding else None
        weight = weights.get(origin)
        words = (f"{origin} ramps: stage {index + 1} of {len(schedule)}, at most "
                 f"{schedule[index]} % of the traffic (now {weight} %), since "
                 + (f"{since[11:19]}Z" if since else "before the records shown") + "; why: "
                 + (str(last.get("rule")) if last else "its last ramp record is older than "
                    "the range shown"))
        detail = last.get("detail") if last else None
        following = detail.get("next") if isinstance(detail, dict) else None
        standbys.append({
            "origin": origin, "stage": index + 1, "stages": len(schedule),
            "share": schedule[index], "weight": weight, "since": since,
            "why": None if last is None else last.get("rule"),
            "seq": None if last is None else last.get("seq"),
            "next": following, "sentence": words})
    return {"standbys": standbys}


def _ramps(part: Any, key: str) -> Mapping[str, Any]:
    """The `ramps` of a ramp record's `detail.state` or `inputs.state_before` ({} if none)."""
    state = part.get(key) if isinstance(part, dict) else None
    ramps = state.get("ramps") if isinstance(state, dict) else None
    return ramps if isinstance(ramps, dict) else {}
