"""The one carry-over rule: what running intent survives a desired-state change (pure), and the
`config_applied` diff of a reload equals what is then served, tier actions included."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control_plane.cli.admin_client import AdminClient
from control_plane.cli.plan import plan_against_server
from control_plane.decide.controller import ControllerState
from control_plane.decide.ramp import RampState
from control_plane.decide.tiers import TierState, actions_in_force
from control_plane.decisions.read import iter_records
from control_plane.desired import parse_desired
from control_plane.desired.model import Desired, Origin, TierActions
from control_plane.intent.carry_over import carry_over
from control_plane.intent.change import StaleChange
from control_plane.intent.pair_changes import PairChange
from control_plane.intent.running import RunningIntent
from control_plane.intent.served import translate_intent
from control_plane.intent.shown import intent_from_json, intent_json
from control_plane.intent.sqlite_store import StateStore
from control_plane.intent.store import IntentBatch
from control_plane.translate import render_json
from control_plane.translate.diff import diff_renderings, format_changes
from control_plane.translate.resources import Capabilities
from harness.envoy_process import free_port
from harness.intent_changes import apply_pair_changes
from harness.models import example_desired, shop_group
from tests.support.example_service import example_service

EWR, SJC = ("ewr", "shop"), ("sjc", "shop")
STREAK = ControllerState(unhealthy_windows={"primary": 1}, healthy_windows={"secondary": 3})
ACTIVE = TierState(active=True, trigger_since_ms=1, active_since_ms=2)
RAMP = RampState(ramps={"secondary": 1})
BY_HAND = TierActions(demote_share=10)  # set without a tier state


def running(desired: Desired) -> RunningIntent:
    return RunningIntent(
        desired,
        weights={EWR: {"primary": 60, "secondary": 40}, SJC: {"primary": 80, "secondary": 20}},
        tier_actions={EWR: TierActions(demote_share=10), SJC: BY_HAND},
        controllers={EWR: STREAK, SJC: STREAK},
        tier_states={EWR: ACTIVE},
        ramps={EWR: RAMP},
    )


def with_group(**changes: object) -> Desired:
    return example_desired(dataclasses.replace(shop_group(), **changes))


def test_the_same_desired_state_keeps_everything_and_the_policy_sets_the_actions() -> None:
    desired = example_desired()
    carried = carry_over(running(desired), desired)
    assert carried.intent.weights == running(desired).weights
    assert carried.intent.controllers == {EWR: STREAK, SJC: STREAK}
    assert carried.intent.tier_states == {EWR: ACTIVE}
    assert carried.intent.ramps == {EWR: RAMP}
    # what the policy makes of the tier state, as the next tick would set it; by hand: kept
    in_force = actions_in_force(desired.group("shop"), ACTIVE)
    assert in_force is not None
    assert carried.intent.tier_actions == {EWR: in_force, SJC: BY_HAND}
    assert carried.notes == {}


def test_a_pop_that_is_gone_loses_everything() -> None:
    desired = example_desired()
    only_sjc = dataclasses.replace(desired, pops=desired.pops[1:])
    carried = carry_over(running(desired), only_sjc)
    assert set(carried.intent.weights) == {SJC}
    assert set(carried.intent.controllers) == {SJC}
    assert carried.intent.tier_actions == {SJC: BY_HAND} and carried.intent.tier_states == {}
    assert carried.intent.ramps == {}
    assert carried.dropped(running(desired)) == [EWR]


def test_weights_that_no_longer_fit_start_over_and_say_why() -> None:
    group = shop_group()
    third = Origin(name="third", address="127.0.0.1", port=8083)
    grown = with_group(
        origins=(*group.origins, third),
        preference={pop: (*names, "third") for pop, names in group.preference.items()},
    )
    carried = carry_over(running(example_desired()), grown)
    assert carried.intent.weights == {}
    assert carried.notes[EWR] == "origin group shop: no weight for third"
    assert carried.intent.weights_of("ewr", "shop") == grown.group("shop").home_weights("ewr")
    # streaks and tier state go with the pair, not with its weights
    assert set(carried.intent.controllers) == {EWR, SJC}
    assert carried.intent.tier_states == {EWR: ACTIVE} and carried.intent.ramps == {EWR: RAMP}


def test_a_disabled_policy_lifts_the_actions_of_its_controller() -> None:
    policy = dataclasses.replace(shop_group().tier_actions, enabled=False)
    carried = carry_over(running(example_desired()), with_group(tier_actions=policy))
    assert carried.intent.tier_actions == {SJC: BY_HAND}
    assert carried.intent.tier_states == {EWR: ACTIVE}


def test_actions_set_by_hand_go_when_their_tier_does() -> None:
    group = shop_group()
    fewer = with_group(tiers=tuple(t for t in group.tiers if t.name != "background"))
    assert "background" not in {t.name for t in fewer.group("shop").tiers}
    carried = carry_over(running(example_desired()), fewer)
    assert SJC not in carried.intent.tier_actions


@given(
    primary=st.integers(min_value=-5, max_value=105),
    enabled=st.booleans(),
    keep_ewr=st.booleans(),
)
def test_carry_over_is_idempotent_and_keeps_only_what_fits(
    primary: int, enabled: bool, keep_ewr: bool
) -> None:
    base = example_desired()
    intent = dataclasses.replace(
        running(base), weights={EWR: {"primary": primary, "secondary": 100 - primary}}
    )
    policy = dataclasses.replace(shop_group().tier_actions, enabled=enabled)
    new = with_group(tier_actions=policy)
    if not keep_ewr:
        new = dataclasses.replace(new, pops=new.pops[1:])
    once = carry_over(intent, new).intent
    assert carry_over(once, new).intent == once
    fits = keep_ewr and 0 <= primary <= 100
    assert (EWR in once.weights) == fits
    assert (EWR in once.tier_actions) == (keep_ewr and enabled)
    assert (EWR in once.ramps) == keep_ewr
    assert all(pop in new.pop_names for pop, _ in [*once.weights, *once.controllers])


async def test_config_applied_diff_equals_what_is_served_tier_actions_included(
    tmp_path: Path,
) -> None:
    async with example_service(tmp_path) as (service, text):
        intent, cache, fifo = service.server.intent, service.server.cache, Capabilities()
        # as after ticks that shifted weights and switched the tier actions on in ewr
        moved = {"primary": 70, "secondary": 30}
        on = actions_in_force(intent.desired.group("shop"), ACTIVE)
        assert on is not None and on.demote_share == 50
        await apply_pair_changes(intent, [PairChange(EWR, moved, STREAK, ACTIVE, tier_actions=on)])
        before = {pop: render_json(cache.resources(pop, fifo)) for pop in ("ewr", "sjc")}
        # the policy's demote share changes: the active actions are pushed with the new one
        edited = text.replace("demote_share: 50%", "demote_share: 30%")
        assert edited != text
        assert await service.reload.apply(edited.encode())
        applied = [r for r in iter_records(tmp_path / "state") if r["kind"] == "config_applied"][-1]
        served = {pop: render_json(cache.resources(pop, fifo)) for pop in ("ewr", "sjc")}
        expected = [
            line
            for pop in ("ewr", "sjc")
            for line in [f"pop {pop}:", *format_changes(diff_renderings(before[pop],
                                                                       served[pop]))]
        ]
        assert applied["detail"]["diff"] == expected
        assert applied["detail"]["pushed_pops"] == ["ewr"]
        assert intent.tier_actions("ewr", "shop") == dataclasses.replace(on, demote_share=30)
        assert any("30" in line for line in applied["detail"]["diff"]), applied["detail"]
        assert intent.weights("ewr", "shop") == moved


async def test_plan_against_the_server_predicts_exactly_what_the_reload_records(
    tmp_path: Path,
) -> None:
    """`ballast plan --server` carries the server's running intent over with the same rule:
    per PoP, its changes are the lines the reload's config_applied record then shows."""
    admin = free_port()
    async with example_service(tmp_path, admin_address=f"127.0.0.1:{admin}") as (service, text):
        intent = service.server.intent
        moved = {"primary": 70, "secondary": 30}
        on = actions_in_force(intent.desired.group("shop"), ACTIVE)
        await apply_pair_changes(intent, [PairChange(EWR, moved, STREAK, ACTIVE, tier_actions=on)])
        edited = text.replace("demote_share: 50%", "demote_share: 30%")
        new = parse_desired(edited.encode(), str(service.config.desired_path))
        client = AdminClient(f"http://127.0.0.1:{admin}")
        plans = await asyncio.to_thread(plan_against_server, client, new, None)
        predicted = [line for plan in plans
                     for line in [f"pop {plan.pop}:", *format_changes(plan.changes)]]
        assert any("30" in line for line in predicted), predicted
        assert await service.reload.apply(edited.encode())
        applied = [r for r in iter_records(tmp_path / "state") if r["kind"] == "config_applied"][-1]
        assert applied["detail"]["diff"] == predicted


async def test_plan_against_the_server_during_a_ramp_predicts_exactly_what_the_reload_pushes(
    tmp_path: Path,
) -> None:
    """While a standby ramps in ewr (its cache-warming mirror on), `ballast plan --server`
    translates the same input the server does: its changes are exactly what the reload then
    pushes to ewr's Envoys (and records), not the mirror routes reported as removed."""
    admin = free_port()
    async with example_service(tmp_path, admin_address=f"127.0.0.1:{admin}",
                               reconcile_interval_ms=3_600_000) as (service, text):
        intent, cache = service.server.intent, service.server.cache
        await apply_pair_changes(intent, [PairChange(EWR, {"primary": 70, "secondary": 30}, STREAK,
                                            ramp=RAMP)])
        assert intent.intent.mirror(*EWR) is not None  # the ramp's mirror is on
        caps = Capabilities()
        served_before = {pop: render_json(cache.resources(pop, caps)) for pop in ("ewr", "sjc")}
        # routes of every PoP, reaching every PoP at once (a rollout's waves are not the
        # subject: the new file's rollout: policy governs its own rollout)
        edited = text.replace("read_timeout: 4s", "read_timeout: 5s") + \
            "rollout: {strategy: immediate}\n"
        assert edited != text
        new = parse_desired(edited.encode(), str(service.config.desired_path))
        client = AdminClient(f"http://127.0.0.1:{admin}")
        plans = {plan.pop: plan for plan in
                 await asyncio.to_thread(plan_against_server, client, new, None)}
        assert await service.reload.apply(edited.encode())
        assert intent.intent.mirror(*EWR) is not None  # still ramping after the reload
        for pop, before in served_before.items():
            pushed = diff_renderings(before, render_json(cache.resources(pop, caps)))
            assert format_changes(plans[pop].changes) == format_changes(pushed), pop
        assert plans["ewr"].changes, "the edit changes ewr's routes"
        applied = [r for r in iter_records(tmp_path / "state") if r["kind"] == "config_applied"][-1]
        assert applied["detail"]["diff"] == [
            line for plan in plans.values()
            for line in [f"pop {plan.pop}:", *format_changes(plan.changes)]]


def test_the_running_intent_reads_back_from_its_json() -> None:
    desired = example_desired()
    intent = running(desired)
    shown = json.loads(json.dumps(intent_json(intent)))
    assert shown["pops"] == ["ewr", "sjc"] and shown["digest"] == desired.digest
    assert intent_from_json(shown, desired) == intent


async def test_a_step_arriving_while_a_reload_saves_waits_and_is_dropped_as_stale(
    tmp_path: Path,
) -> None:
    """The reload's store write is awaited (on a thread); a reconcile step planned for the old
    desired state that arrives then waits for the reload's swap (one change between save and
    swap at a time) and is dropped (`StaleChange`: its plan was made for what no longer runs);
    a step planned afterwards lands. What is served is the running intent translated, and what
    is stored agrees."""
    async with example_service(tmp_path, reconcile_interval_ms=3_600_000) as (service, text):
        intent = service.server.intent
        store = service.store
        assert isinstance(store, StateStore)
        write = store.write
        moved = {"primary": 70, "secondary": 30}
        steps: list[asyncio.Task[frozenset[str]]] = []

        async def write_while_a_step_arrives(batch: IntentBatch) -> None:
            if batch.desired_digest is not None and not steps:  # the reload's save
                steps.append(asyncio.create_task(apply_pair_changes(
                    intent, [PairChange(EWR, moved, STREAK)])))
                await asyncio.sleep(0.05)  # the step prepares, and waits for the lock
                assert not steps[0].done()
            await write(batch)

        store.write = write_while_a_step_arrives  # type: ignore[method-assign]
        edited = text.replace("demote_share: 50%", "demote_share: 30%")
        assert await service.reload.apply(edited.encode())
        with pytest.raises(StaleChange):
            await steps[0]
        assert intent.desired.group("shop").tier_actions.demote_share == 30
        assert intent.weights("ewr", "shop") != moved
        await apply_pair_changes(intent, [PairChange(EWR, moved, STREAK)])  # planned for what runs
        assert intent.weights("ewr", "shop") == moved
        assert store.load().groups[EWR].weights == moved
        served = service.server.cache.resources("ewr", Capabilities())  # what Envoys get
        assert render_json(served) == render_json(
            translate_intent(intent.intent, "ewr", Capabilities()))
