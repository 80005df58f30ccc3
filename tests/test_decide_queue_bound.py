"""Queues bounded in time (`decide/tiers.py` part 4): a tier's pending limit follows from its slots,
its queue_timeout and the origin's measured latency, and reaches Envoy as a runtime override."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from control_plane.decide.tiers import (
    TierState,
    actions_in_force,
    queue_limits,
    service_time_ms,
    tier_step,
)
from control_plane.translate.runtime import tier_runtime
from harness.models import shop_group

GROUP = shop_group()  # 120 origin connections: critical 84 / normal 30 / background 6 slots


def test_the_limit_is_slots_times_queue_timeout_over_latency() -> None:
    # 200 ms per request: critical 84 x 800 / 200 = 336, normal 30 x 1500 / 200 = 225,
    # background 6 x 3000 / 200 = 90
    assert queue_limits(GROUP, {}, 200.0) == {"critical": 336, "normal": 225, "background": 90}
    # borrowed or taken slots drain the queue too
    assert queue_limits(GROUP, {"normal": 40}, 200.0)["normal"] == 300
    # a fast origin: the depths (2000 / 8000 / 2000) are the bound; a dead slow one: at least 1
    assert queue_limits(GROUP, {}, 1.0) == {"critical": 2000, "normal": 8000, "background": 2000}
    assert queue_limits(GROUP, {}, 1e9) == {"critical": 1, "normal": 1, "background": 1}


@given(st.floats(0.5, 100_000), st.sampled_from(GROUP.tiers))
def test_a_full_queue_drains_within_the_queue_timeout(latency: float, tier: object) -> None:
    limit = queue_limits(GROUP, {}, latency)[tier.name]
    slots = GROUP.guarantee(tier)
    if limit > 1:  # the queue waits at most queue_timeout (one request always may wait)
        assert limit * latency / slots <= tier.queue_timeout_ms + 1e-6
    assert 1 <= limit <= tier.max_queue_depth


def test_service_time_is_the_weighted_p50() -> None:
    assert service_time_ms({"primary": 100.0, "secondary": 20.0},
                           {"primary": 75, "secondary": 25}) == 80.0
    assert service_time_ms({"primary": None, "secondary": 20.0},
                           {"primary": 95, "secondary": 5}) == 20.0
    assert service_time_ms({"primary": None}, {"primary": 100}) is None


def test_the_tier_step_bounds_queues_records_it_and_waits_within_the_slack() -> None:
    first = tier_step(GROUP, TierState(), None, 1000, latency_ms=200.0)
    # critical's queue counts the slots it could still take from normal (30 - its floor 6):
    # (84 + 24) x 800 / 200 = 432
    assert first.state.queue_limits == (("background", 90), ("critical", 432), ("normal", 225))
    (decision,) = [d for d in first.decisions if d.kind == "tier_queue"]
    assert "normal 30 x 1500 ms / 200 ms = 225" in decision.rule
    assert "critical 108 x 800 ms / 200 ms = 432" in decision.rule
    assert first.actions is not None
    assert dict(first.actions.pending_limits) == {"background": 90, "critical": 432,
                                                  "normal": 225}
    assert first.actions.shed == frozenset() and first.actions.demote_tier is None
    # 210 ms: every new limit within 10 % of the one in force: nothing changes
    same = tier_step(GROUP, first.state, None, 2000, latency_ms=210.0)
    assert same.state == first.state and not same.decisions
    # the origin fast again: the depths bound the queues, the overrides go
    fast = tier_step(GROUP, first.state, None, 3000, latency_ms=2.0)
    assert fast.state.queue_limits == () and fast.actions is None
    assert [d.kind for d in fast.decisions] == ["tier_queue"]
    # no latency measured: the limits in force stay
    held = tier_step(GROUP, first.state, None, 4000, latency_ms=None)
    assert held.state.queue_limits == first.state.queue_limits


def test_borrowed_slots_size_no_queue_taken_ones_do() -> None:
    """Background borrows 10 idle slots: its queue stays what its own 6 drain in 3 s (they go
    back the moment their lender needs them, and 160 queued requests would then wait 16 s);
    critical's counts what it took and what it could still take from normal."""
    state = TierState(lent=(("background", 10),), took=(("critical", 4),))
    result = tier_step(GROUP, state, None, 1000, latency_ms=200.0)
    limits = dict(result.state.queue_limits)
    assert limits["background"] == 90  # 6 x 3000 / 200, not 16 x 3000 / 200
    assert limits["critical"] == 432  # (84 + 4 taken + 20 normal could still give) x 800 / 200


def test_limits_reach_envoy_as_runtime_overrides_and_survive_a_restart() -> None:
    state = TierState(queue_limits=(("normal", 225),))
    assert TierState.from_dict(state.to_dict()) == state
    actions = actions_in_force(GROUP, state)
    assert actions is not None
    layer = tier_runtime({"shop": actions}, {"shop": GROUP}).layer
    assert dict(layer) == {"circuit_breakers.shop.normal.default.max_pending_requests": 225}
    # a limit at or above the depth (a desired-state change lowered the depth) is not used
    shallow = replace(GROUP, tiers=tuple(replace(t, max_queue_depth=100) for t in GROUP.tiers))
    assert actions_in_force(shallow, TierState(queue_limits=(("normal", 225),))) is None
