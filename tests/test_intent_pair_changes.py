"""What a reconcile tick changes in the running intent (`intent/pair_changes.py`, pure): only what
differs, laid over the intent pair by pair; a step that changes nothing costs nothing."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from control_plane.decide.controller import ControllerState
from control_plane.decide.ramp import RampState
from control_plane.decide.tiers import TierState
from control_plane.desired.model import TierActions
from control_plane.intent.pair_changes import PairChange, TickChanges, applied, changes_of
from control_plane.intent.running import RunningIntent
from control_plane.intent.store import RAMP_KIND, TIER_KIND
from harness.models import example_desired, shop_group

PAIRS = [("ewr", "shop"), ("sjc", "shop")]
# critical hedges: the ramp guards its hedges, so a ramp step can change a PoP's routes
_GROUP = shop_group()
DESIRED = example_desired(replace(_GROUP, tiers=tuple(
    replace(t, hedge_delay_ms=50) if t.name == "critical" else t for t in _GROUP.tiers)))

weights = st.integers(0, 100).map(lambda p: {"primary": p, "secondary": 100 - p})
streaks = st.builds(
    lambda u, h: ControllerState(unhealthy_windows={"primary": u}, healthy_windows={"primary": h}),
    st.integers(0, 3), st.integers(0, 3))
tier_states = st.sampled_from([
    TierState(), TierState(active=True, trigger_since_ms=1, active_since_ms=2),
    TierState(shedding=True, shed_since_ms=5)])
ramps = st.sampled_from([RampState(), RampState(ramps={"secondary": 1}),
                         RampState(ramps={"secondary": 2}),  # a step on: the mirror stays
                         RampState(warm_pool_since_ms={"primary": 0})])
actions = st.sampled_from([None, TierActions(demote_share=10), TierActions(demote_share=30)])


@st.composite
def intents(draw: st.DrawFn) -> RunningIntent:
    held = {pair: draw(weights) for pair in PAIRS if draw(st.booleans())}
    return RunningIntent(
        DESIRED,
        weights=held,
        controllers={pair: draw(streaks) for pair in PAIRS if draw(st.booleans())},
        tier_states={pair: s for pair in PAIRS for s in [draw(tier_states)] if not s.idle},
        ramps={pair: r for pair in PAIRS for r in [draw(ramps)] if r != RampState()},
        tier_actions={pair: a for pair in PAIRS for a in [draw(actions)] if a is not None},
    )


@st.composite
def step_lists(draw: st.DrawFn) -> list[PairChange]:
    pairs = draw(st.lists(st.sampled_from(PAIRS), unique=True))
    return [PairChange(pair, draw(weights), draw(streaks), draw(st.none() | tier_states),
                       draw(st.none() | ramps), draw(actions)) for pair in pairs]


def view(intent: RunningIntent) -> dict[tuple[str, str], tuple[object, ...]]:
    """Per pair, what is in force (defaults where nothing is held)."""
    return {pair: (intent.weights_of(*pair),
                   intent.controllers.get(pair, ControllerState()),
                   intent.tier_states.get(pair, TierState()),
                   intent.ramps.get(pair, RampState()),
                   intent.tier_actions.get(pair),
                   intent.mirror(*pair),
                   intent.hedge_share(*pair))
            for pair in PAIRS}


@given(intents(), step_lists())
def test_applying_a_ticks_changes_gives_what_the_steps_say_and_nothing_else(
    running: RunningIntent, steps: list[PairChange]
) -> None:
    after = applied(running, changes_of(running, steps))
    expected = view(running)
    for step in steps:
        *_, tiers, ramp, acts, _, _ = expected[step.key]
        if step.tier_state is not None:
            tiers, acts = step.tier_state, step.tier_actions
        if step.ramp is not None:
            ramp = step.ramp
        alone = RunningIntent(DESIRED, weights={step.key: step.weights},
                              ramps={step.key: ramp})
        expected[step.key] = (step.weights, step.controller, tiers, ramp, acts,
                              alone.mirror(*step.key), alone.hedge_share(*step.key))
    assert view(after) == expected


@given(intents(), step_lists())
def test_the_same_steps_again_change_nothing(
    running: RunningIntent, steps: list[PairChange]
) -> None:
    after = applied(running, changes_of(running, steps))
    again = changes_of(after, steps)
    assert not again and again.pops == frozenset()
    assert again.batch(DESIRED.digest).groups == () and not again.batch(DESIRED.digest)
    assert applied(after, again) is after


@given(intents(), step_lists())
def test_only_pops_whose_output_moves_are_named(
    running: RunningIntent, steps: list[PairChange]
) -> None:
    """A PoP is re-translated when its weights, tier actions, mirror or hedge share change —
    never for a streak, a tier state or a ramp that leaves the mirror and the hedge share as
    they were."""
    changes = changes_of(running, steps)
    before, after = view(running), view(applied(running, changes))

    def output(parts: tuple[object, ...]) -> tuple[object, ...]:
        return parts[0], parts[4], parts[5], parts[6]

    moved = {pop for (pop, group), now in after.items()
             if output(now) != output(before[(pop, group)])}
    assert changes.pops == moved


def test_a_steady_pair_writes_nothing_and_a_changed_one_writes_its_row_and_records() -> None:
    running = RunningIntent(DESIRED, controllers={PAIRS[0]: ControllerState(
        unhealthy_windows={"primary": 0}, healthy_windows={"primary": 3})})
    home = running.weights_of(*PAIRS[0])
    steady = PairChange(PAIRS[0], home, running.controllers[PAIRS[0]], TierState(), RampState())
    assert changes_of(running, [steady]) == TickChanges()
    moved = {"primary": 85, "secondary": 15}
    ramp = RampState(ramps={"secondary": 1})
    changes = changes_of(running, [PairChange(PAIRS[1], moved, ControllerState(), ramp=ramp)])
    batch = changes.batch(DESIRED.digest)
    assert batch.groups == (("sjc", "shop", moved, ControllerState()),)
    assert batch.records == ((RAMP_KIND, "sjc/shop", ramp.to_dict()),)
    assert changes.pops == {"sjc"}
    ended = changes_of(applied(running, changes),
                       [PairChange(PAIRS[1], moved, ControllerState(), TierState(), RampState())])
    assert ended.batch(DESIRED.digest).records == ((RAMP_KIND, "sjc/shop", None),)
    assert TIER_KIND not in {kind for kind, _, _ in ended.batch(DESIRED.digest).records}


def test_a_ramp_step_at_the_same_weights_re_translates_for_its_hedge_share() -> None:
    """Issue 33: the hedge share follows the ramp's step; a step on (the mirror stays on, the
    weights as they were) gives the standby more headroom: the PoP's routes change."""
    key = ("ewr", "shop")
    held = {"primary": 90, "secondary": 10}
    running = RunningIntent(DESIRED, weights={key: held},
                            ramps={key: RampState(ramps={"secondary": 1})})
    step = PairChange(key, dict(held), ControllerState(), None,
                      RampState(ramps={"secondary": 2}), None)
    changes = changes_of(running, [step])
    assert running.mirror(*key) == applied(running, changes).mirror(*key)
    assert running.hedge_share(*key) == 0
    assert applied(running, changes).hedge_share(*key) == 111_111
    assert changes.pops == frozenset({"ewr"})
