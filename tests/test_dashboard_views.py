"""The dashboard's pure views (`admin/dashboard_views.py`): inputs -> what the page gets."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from control_plane.admin.dashboard_views import (
    AWAY_LISTED_PER_POP,
    SCORE_AT_THRESHOLD,
    overview,
    ramp_view,
    timeline,
)
from control_plane.ads.nodes import PopCensus
from control_plane.desired import Desired, parse_desired
from control_plane.desired.model import TierActions
from harness.ads_desired import desired

DESIRED = desired(listener_port=10000, primary_port=8081, secondary_port=8082, media_port=8083)
SHOP = DESIRED.group("shop")
HOME = {"primary": 95, "secondary": 5}
END = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
START = END - timedelta(minutes=15)


def record(seq: int, kind: str, **fields: object) -> dict[str, object]:
    return {"seq": seq, "time": f"2026-11-30T11:5{seq}:00.000Z", "kind": kind, "pop": "ewr",
            "group": "shop", **fields}


@pytest.mark.parametrize(
    ("records", "initial", "points", "markers"),
    [
        ([], {"primary": 70, "secondary": 30}, [], []),
        (
            [record(1, "weight_shift", weights_before=HOME,
                    weights_after={"primary": 85, "secondary": 15},
                    inputs={"scores": {"primary": {"composite": 0.2}}},
                    detail={"next": "again"}),
             record(2, "tier_action", rule="demote"),
             record(3, "ramp_capped", weights_before={"primary": 85, "secondary": 15},
                    weights_after={"primary": 90, "secondary": 10})],
            HOME,
            [(1, {"primary": 85, "secondary": 15}, {"primary": 0.2}, "again"),
             (3, {"primary": 90, "secondary": 10}, {}, None)],
            [2],
        ),
        (
            [record(4, "nack", rule="rejected"),
             record(5, "hold", weights_before={"primary": 60, "secondary": 40},
                    weights_after={"primary": 60, "secondary": 40}, detail={"next": "wait"})],
            {"primary": 60, "secondary": 40},
            [(5, {"primary": 60, "secondary": 40}, {}, "wait")],
            [4],
        ),
    ],
)
def test_timeline_line_follows_weight_records_and_marks_the_rest(
    records: list[dict[str, object]],
    initial: dict[str, int],
    points: list[tuple[int, dict[str, int], dict[str, float], str | None]],
    markers: list[int],
) -> None:
    body = timeline(DESIRED, "ewr", SHOP, records, {"primary": 70, "secondary": 30}, START, END,
                    truncated=False)
    assert body["initial"] == initial
    assert [(p["seq"], p["weights"], p["scores"], p["next"]) for p in body["points"]] == points
    assert [m["seq"] for m in body["markers"]] == markers
    assert body["start"] == "2026-11-30T11:45:00.000Z" and body["end"] == "2026-11-30T12:00:00.000Z"
    assert body["origins"] == ["primary", "secondary"] and body["home"] == HOME
    assert body["thresholds"]["min_warm_pool"] == SHOP.failover.min_warm_pool
    assert body["thresholds"]["score_at_threshold"] == SCORE_AT_THRESHOLD == pytest.approx(0.8)


def test_overview_counts_nodes_lists_away_groups_and_trims_config_records() -> None:
    census = {
        "ewr": PopCensus(Counter({("SYNCED", "1.40.0"): 3, ("NACKED", "1.36.2"): 1}), [], []),
        "lax": PopCensus(Counter({("STALE", "1.40.0"): 2}), [], []),  # not in the desired state
    }
    weights = {"ewr": {"shop": {"primary": 50, "secondary": 50}, "media": {"cdn": 100}},
               "sjc": {"shop": dict(HOME)}}
    actions = {"sjc": {"shop": TierActions()}}
    applied = record(7, "config_applied", config_version="abc", rule="applied",
                     detail={"diff": ["pop ewr:"]}, inputs={"big": "x" * 100})
    body = overview(DESIRED, census, weights, actions,
                    {"config_applied": applied, "config_rejected": None})
    pops = {p["name"]: p for p in body["pops"]}
    assert list(pops) == ["ewr", "lax", "sjc"]
    assert pops["ewr"]["by_status"] == {"SYNCED": 3, "STALE": 0, "NACKED": 1}
    assert pops["ewr"]["envoy_versions"] == {"1.36.2": 1, "1.40.0": 3}
    assert pops["ewr"]["away"] == [{"group": "shop", "weights": {"primary": 50, "secondary": 50}}]
    assert pops["sjc"]["away_count"] == 0 and pops["sjc"]["node_count"] == 0
    assert "normal" in pops["sjc"]["tier_actions"]["shop"]["description"]
    assert not pops["lax"]["known"] and pops["lax"]["groups"] == 0
    assert body["config"]["config_applied"] == {
        "seq": 7, "time": applied["time"], "kind": "config_applied", "config_version": "abc",
        "rule": "applied", "detail": {"diff": ["pop ewr:"]}}
    assert body["config"]["config_rejected"] is None
    assert body["desired"]["version"] == DESIRED.digest[:16]


def _many_groups(count: int) -> Desired:
    groups = "".join(
        f"""
  g{n:02d}:
    origins: {{a: {{address: 127.0.0.1, port: {9000 + n}}}, b: {{address: 127.0.0.1, port: 9500}}}}
    preference: {{ewr: [a, b]}}""" for n in range(count))
    hosts = "".join(f"""
      - {{name: g{n:02d}, domains: [g{n:02d}.test], origin_group: g{n:02d}}}"""
                    for n in range(count))
    return parse_desired(f"""\
pops:
  ewr: {{listen_address: 127.0.0.1, port_offset: 0}}
origin_groups:{groups}
listeners:
  - name: edge
    port: 10000
    virtual_hosts:{hosts}
""", "<many groups>")


def test_overview_lists_a_bounded_number_of_away_groups_but_counts_all() -> None:
    many = _many_groups(AWAY_LISTED_PER_POP + 5)
    weights = {"ewr": {g.name: {"a": 50, "b": 50} for g in many.origin_groups}}
    body = overview(many, {}, weights, {}, {})
    (ewr,) = body["pops"]
    assert ewr["away_count"] == AWAY_LISTED_PER_POP + 5
    assert len(ewr["away"]) == AWAY_LISTED_PER_POP


def _ramp(seq: int, kind: str, before: dict[str, int], after: dict[str, int], rule: str,
          ) -> dict[str, object]:
    return record(seq, kind, rule=rule, inputs={"state_before": {"ramps": before}},
                  detail={"state": {"ramps": after}, "next": f"next after {seq}"})


def test_the_ramp_in_words_step_share_since_and_why() -> None:
    """Each ramping standby: its step and the share it allows, its weight, since when (the
    record that took it from not ramping to ramping, the newest such), why (the newest ramp
    record that has it ramping: its rule, its next)."""
    records = [
        _ramp(1, "ramp_start", {}, {"secondary": 0}, "an older ramp starts"),
        _ramp(2, "ramp_end", {"secondary": 0}, {}, "it ended"),
        record(3, "weight_shift", rule="not a ramp record"),
        _ramp(4, "ramp_start", {}, {"secondary": 1}, "secondary is cold: ramp starts"),
        _ramp(5, "ramp_advance", {"secondary": 1}, {"secondary": 2}, "secondary healthy: stage 3"),
    ]
    shown = ramp_view(SHOP, {"ramps": {"secondary": 2}, "warm_pool_since_ms": {}}, records,
                      {"primary": 80, "secondary": 20})
    assert shown == {"standbys": [{
        "origin": "secondary", "stage": 3, "stages": 4, "share": 20, "weight": 20,
        "since": "2026-11-30T11:54:00.000Z", "why": "secondary healthy: stage 3", "seq": 5,
        "next": "next after 5",
        "sentence": "secondary ramps: stage 3 of 4, at most 20 % of the traffic (now 20 %), "
                    "since 11:54:00Z; why: secondary healthy: stage 3"}]}
    # its records older than the range: said so, not made up
    alone = ramp_view(SHOP, {"ramps": {"secondary": 0}}, [], {"secondary": 5})
    assert alone["standbys"][0]["sentence"] == (
        "secondary ramps: stage 1 of 4, at most 5 % of the traffic (now 5 %), since before the "
        "records shown; why: its last ramp record is older than the range shown")
