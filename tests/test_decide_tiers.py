"""The tier step: activation after `for`, lifting after `recover_after`, holds on bad readings."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from control_plane.decide.signals import TierPending
from control_plane.decide.tiers import TierState, tier_step
from control_plane.desired.model import TierActionPolicy, TierActions

T0 = 1_800_000_000_000
POLICY = TierActionPolicy()  # seed 000: > 10 pending for 30 s; lifted after 60 s without
ACTIVE = TierState(active=True, trigger_since_ms=T0 - 40_000, active_since_ms=T0 - 10_000)


def reading(pending: float, age_ms: int = 0, now: int = T0) -> dict[str, TierPending]:
    return {"critical": TierPending(pending_max=pending, observed_at_ms=now - age_ms)}


@pytest.mark.parametrize(
    ("case", "policy", "state", "pending", "kind", "active", "rule_has"),
    [
        ("quiet", POLICY, TierState(), reading(3), None, False, "critical pending max 3 ≤ 10"),
        ("at the limit is not above it", POLICY, TierState(), reading(10), None, False, "≤ 10"),
        ("trigger starts the count", POLICY, TierState(), reading(25), None, False,
         "for 0 s of 30 s"),
        ("trigger held 20 s of 30", POLICY, TierState(trigger_since_ms=T0 - 20_000), reading(25),
         None, False, "for 20 s of 30 s"),
        ("trigger held 30 s: on", POLICY, TierState(trigger_since_ms=T0 - 30_000), reading(25),
         "tier_action", True,
         "critical pending max 25 > 10 for 30 s (≥ 30 s): demote 50% of normal to background, "
         "shed background (503, retry-after 60 s)"),
        ("a quiet tick restarts the count", POLICY, TierState(trigger_since_ms=T0 - 20_000),
         reading(2), None, False, "no trigger"),
        ("on and still triggered", POLICY, ACTIVE, reading(40), None, True, "actions stay on"),
        ("on, quiet 0 s of 60", POLICY, ACTIVE, reading(1), None, True, "for 0 s of 60 s"),
        ("on, quiet 60 s: lifted", POLICY, replace(ACTIVE, clear_since_ms=T0 - 60_000),
         reading(1), "tier_action", False, "(≥ recover_after 60 s): lifted"),
        ("no reading holds on", POLICY, ACTIVE, None, None, True,
         "fail static: no pending metrics for tier critical; actions stay on"),
        ("no critical tier reading holds off", POLICY, TierState(trigger_since_ms=T0 - 20_000),
         {"normal": TierPending(90, T0)}, None, False, "actions stay off"),
        ("stale reading holds on", POLICY, ACTIVE, reading(0, age_ms=50_000), None, True,
         "stale (50 s > 45 s); actions stay on"),
        ("disabled lifts at once", replace(POLICY, enabled=False), ACTIVE, reading(40),
         "tier_action", False, "disabled in the desired state: lifted"),
        ("disabled and off: nothing", replace(POLICY, enabled=False), TierState(), reading(40),
         None, False, "tier actions disabled"),
        ("for 0 s: on at the first trigger", replace(POLICY, for_ms=0), TierState(), reading(11),
         "tier_action", True, "for 0 s (≥ 0 s)"),
    ],
)
def test_tier_step_table(
    case: str,
    policy: TierActionPolicy,
    state: TierState,
    pending: dict[str, TierPending] | None,
    kind: str | None,
    active: bool,
    rule_has: str,
) -> None:
    result = tier_step(policy, state, pending, T0)
    assert result.kind == kind, (case, result.rule)
    assert result.state.active is active, case
    assert rule_has in result.rule, (case, result.rule)
    assert (result.actions is not None) is active, case
    if active:
        assert result.actions == TierActions() == policy.actions()


def test_a_run_from_trigger_to_recovery_every_20_s() -> None:
    """Ticks every 20 s: on at the third triggered tick (40 s ≥ 30 s), off 60 s after the first
    quiet tick; only the two changes are `tier_action`."""
    pending = [25, 25, 25, 30, 4, 5, 3, 2, 2]
    state, kinds, active = TierState(), [], []
    for tick, value in enumerate(pending):
        now = T0 + tick * 20_000
        result = tier_step(POLICY, state, reading(value, now=now), now)
        state = result.state
        kinds.append(result.kind)
        active.append(state.active)
    assert active == [False, False, True, True, True, True, True, False, False]
    assert kinds == [None, None, "tier_action", None, None, None, None, "tier_action", None]
    assert state == TierState() and state.idle


def test_a_hold_keeps_the_timers() -> None:
    counting = TierState(trigger_since_ms=T0 - 20_000)
    held = tier_step(POLICY, counting, None, T0)
    assert held.state == counting and held.kind is None
    after = tier_step(POLICY, held.state, reading(30, now=T0 + 10_000), T0 + 10_000)
    assert after.kind == "tier_action"


def test_record_fields_and_state_round_trip_through_json() -> None:
    result = tier_step(POLICY, TierState(trigger_since_ms=T0 - 30_000), reading(25), T0)
    fields = json.loads(json.dumps(result.record_fields()))
    assert fields["inputs"]["pending"] == {"pending_max": 25, "observed_at_ms": T0}
    assert fields["inputs"]["trigger_pending"] == 10
    assert fields["inputs"]["state_before"]["trigger_since_ms"] == T0 - 30_000
    assert fields["detail"]["actions"] == {
        "demote_tier": "normal", "demote_to": "background", "demote_share": 50,
        "shed_tier": "background", "retry_after_s": 60,
    }
    assert TierState.from_dict(json.loads(json.dumps(result.state.to_dict()))) == result.state


@pytest.mark.parametrize(
    "bad",
    [None, {}, {"active": "yes", "trigger_since_ms": None, "clear_since_ms": None,
                "active_since_ms": None},
     {"active": True, "trigger_since_ms": -1, "clear_since_ms": None, "active_since_ms": None}],
)
def test_state_from_dict_refuses_anything_else(bad: object) -> None:
    with pytest.raises(ValueError):
        TierState.from_dict(bad)


def test_actions_of_a_policy_without_demotion_or_shedding() -> None:
    actions = replace(POLICY, demote_share=0, shed_tier=None).actions()
    assert actions == TierActions(demote_tier=None, demote_to=None, demote_share=0,
                                  shed_tier=None, retry_after_s=60)
