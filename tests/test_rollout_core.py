"""The pure rollout core: waves, bake, gates, rollback, operator actions, supersede, replay.

Tables for the rules, Hypothesis for the invariants: a PoP never gets a version its wave has not
reached; a rollback restores the last passed version everywhere; a NACK always fails; an
inconclusive window neither passes nor fails; pause stops progress; promote finishes.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane.decide.gates import (
    MAX_MESSAGE_CHARS,
    GateInputs,
    GateResult,
    Nack,
    NodeAck,
    PopWindow,
    TierShed,
    evaluate,
)
from control_plane.decide.rollout import (
    NEXT_STEP_AFTER_ROLLBACK,
    ROLLOUT_KINDS,
    Rollout,
    RolloutError,
    abort,
    advance,
    failed_version,
    last_passed,
    look,
    pause,
    plan_waves,
    promote,
    reached,
    replay_look,
    resume,
    serving_since,
    start,
    supersede,
    timeline,
    version_of,
)
from control_plane.decide.signals import OriginSignals
from control_plane.decisions.kinds import KINDS
from control_plane.decisions.log import draft
from control_plane.desired.model import RolloutGates, RolloutPolicy

OLD, NEW, NEWER = "a" * 64, "b" * 64, "c" * 64
POPS = ("ewr", "sjc", "lhr", "fra", "nrt")
POLICY = RolloutPolicy()
BAKE = POLICY.bake_ms
GATES = POLICY.gates


def signals(requests: int = 200, errors: int = 0, p95: float | None = 100.0,
            p95_low: float | None = None) -> OriginSignals:
    return OriginSignals(requests=requests, errors_5xx=errors, connect_failures=0,
                         p50_ms=None if p95 is None else p95 / 2, p95_ms=p95,
                         pending_active=0, queue_overflow=0, probe_success=None,
                         observed_at_ms=0, latency_samples=requests if p95 else 0,
                         p95_low_ms=p95_low)


def window(pop: str, sig: OriginSignals | None = None, onsets: int = 0,
           shed: TierShed | None = None) -> PopWindow:
    return PopWindow(pop, (("shop", "primary", sig or signals()),),
                     (("shop", "background", shed),) if shed else (), onsets)


def healthy(rollout: Rollout, **after: OriginSignals) -> GateInputs:
    """Every node of the reached PoPs ACKed, every window healthy (or as given)."""
    pops = reached(rollout)
    others = [p for p in rollout.pops if p not in pops]
    return GateInputs(
        nodes=tuple(NodeAck(p, f"{p}-1", rollout.to_version) for p in sorted(pops)),
        after=tuple(window(p, after.get(p)) for p in sorted(pops)),
        peers=tuple(window(p) for p in others),
        before=tuple(window(p) for p in sorted(pops)),
    )


def begin(policy: RolloutPolicy = POLICY, pops: tuple[str, ...] = POPS) -> Rollout:
    rollout, _ = start(policy, OLD, NEW, pops, pops, 0)
    return rollout


# --- waves ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("policy", "pops", "old_pops", "waves"), [
    (POLICY, POPS, POPS, (("ewr",), ("sjc", "lhr"), ("fra", "nrt"))),
    (RolloutPolicy(canary=("lhr", "fra")), POPS, POPS,
     (("lhr", "fra"), ("ewr", "sjc"), ("nrt",))),
    (RolloutPolicy(waves=(10, 100)), POPS, POPS, (("ewr",), ("sjc",), ("lhr", "fra", "nrt"))),
    (RolloutPolicy(waves=(100,)), POPS, POPS, (("ewr",), ("sjc", "lhr", "fra", "nrt"))),
    (POLICY, ("ewr",), ("ewr",), (("ewr",),)),
    (POLICY, ("ewr", "sjc"), ("ewr", "sjc"), (("ewr",), ("sjc",))),
    # a PoP the new version adds joins the canary (it serves nobody yet)
    (POLICY, ("ewr", "sjc", "lhr"), ("ewr", "sjc"), (("ewr", "lhr"), ("sjc",))),
    # a PoP it removes leaves in the last wave
    (POLICY, ("ewr", "sjc", "lhr"), ("ewr", "sjc", "lhr", "fra"),
     (("ewr",), ("sjc",), ("lhr", "fra"))),
    (POLICY, ("ewr",), ("ewr", "fra"), (("ewr",), ("fra",))),
    (RolloutPolicy(strategy="immediate"), POPS, POPS, (POPS,)),
])
def test_plan_waves(policy: RolloutPolicy, pops: tuple[str, ...], old_pops: tuple[str, ...],
                    waves: tuple[tuple[str, ...], ...]) -> None:
    assert plan_waves(policy, pops, old_pops) == waves


@settings(max_examples=200, deadline=None)
@given(
    pops=st.lists(st.sampled_from([f"p{i}" for i in range(12)]), min_size=1, max_size=12,
                  unique=True),
    old=st.lists(st.sampled_from([f"p{i}" for i in range(12)]), max_size=12, unique=True),
    waves=st.lists(st.integers(1, 99), max_size=4, unique=True).map(
        lambda w: (*sorted(w), 100)),
    canary=st.lists(st.sampled_from([f"p{i}" for i in range(12)]), max_size=3, unique=True),
)
def test_waves_reach_every_pop_once_canary_first(pops: list[str], old: list[str],
                                                  waves: tuple[int, ...],
                                                  canary: list[str]) -> None:
    policy = RolloutPolicy(canary=tuple(canary), waves=waves)
    planned = plan_waves(policy, pops, old)
    flat = [pop for wave in planned for pop in wave]
    assert sorted(flat) == sorted(set(pops) | set(old))
    assert all(planned)
    expected_canary = [p for p in pops if p in canary] or pops[:1]
    assert set(expected_canary) <= set(planned[0])


# --- start, versions ---------------------------------------------------------------------------

def test_start_bakes_the_canary_and_the_others_keep_the_old_version() -> None:
    rollout, events = start(POLICY, OLD, NEW, POPS, POPS, 1000, by="file change")
    assert [e.kind for e in events] == ["rollout_started", "wave_started"]
    assert rollout.phase == "baking" and rollout.wave == 0
    assert {pop: version_of(rollout, pop)[0] for pop in POPS} == {
        "ewr": "b", "sjc": "a", "lhr": "a", "fra": "a", "nrt": "a"}
    assert "[ewr] -> [sjc, lhr] -> [fra, nrt], each baked 300 s" in events[0].rule
    assert "(file change)" in events[0].rule


@pytest.mark.parametrize("policy,immediate,why", [
    (POLICY, True, "immediate apply (--now)"),
    (RolloutPolicy(strategy="immediate"), False, "rollout strategy immediate"),
])
def test_immediate_puts_every_pop_on_the_new_version_at_once_and_says_so(
        policy: RolloutPolicy, immediate: bool, why: str) -> None:
    rollout, events = start(policy, OLD, NEW, POPS, POPS, 0, immediate=immediate)
    assert rollout.phase == "passed" and rollout.immediate
    assert all(version_of(rollout, pop) == NEW for pop in POPS)
    assert [e.kind for e in events] == ["rollout_started", "rollout_passed"]
    assert all(why in e.rule for e in events)
    assert events[0].detail is not None and events[0].detail["immediate"] is True


def test_every_kind_is_a_decision_kind_and_events_make_records() -> None:
    assert set(ROLLOUT_KINDS) <= set(KINDS)
    _, events = start(POLICY, OLD, NEW, POPS, POPS, 0)
    for event in events:
        made = draft(event.kind, **event.record_fields())
        assert made.fields["config_version"] == NEW[:16]


# --- looking ----------------------------------------------------------------------------------

def test_a_good_change_goes_wave_by_wave_after_each_bake() -> None:
    rollout = begin()
    rollout, events = look(rollout, healthy(rollout), BAKE - 2, POLICY)
    assert [e.kind for e in events] == ["gate_reading"] and rollout.wave == 0
    assert rollout.gate is not None and rollout.gate.verdict == "pass"
    assert "wave 1: gate passes: 1 PoP(s) on the new version" in events[0].rule
    rollout, events = look(rollout, healthy(rollout), BAKE - 1, POLICY)
    assert events == ()  # the same verdict: no record
    rollout, events = look(rollout, healthy(rollout), BAKE, POLICY)
    assert [e.kind for e in events] == ["wave_passed", "wave_started"]
    assert rollout.wave == 1 and rollout.wave_started_ms == BAKE
    assert {p for p in POPS if version_of(rollout, p) == NEW} == {"ewr", "sjc", "lhr"}
    rollout, _ = look(rollout, healthy(rollout), 2 * BAKE, POLICY)
    rollout, events = look(rollout, healthy(rollout), 3 * BAKE, POLICY)
    assert [e.kind for e in events] == ["wave_passed", "rollout_passed"]
    assert rollout.phase == "passed" and last_passed(rollout) == NEW
    assert all(version_of(rollout, p) == NEW for p in POPS)
    assert look(rollout, healthy(rollout), 4 * BAKE, POLICY) == (rollout, ())


def test_a_nack_rolls_back_at_once_with_the_message() -> None:
    rollout = begin()
    nack = Nack("ewr", "ewr-136", NEW, "1.36.2", "type.googleapis.com/envoy.config.cluster.v3."
                "Cluster", "Proto constraint validation failed: unknown field")
    inputs = replace(healthy(rollout), nacks=(nack,))
    rollout, events = look(rollout, inputs, 1000, POLICY)
    assert rollout.phase == "rolled_back" and failed_version(rollout) == NEW
    assert all(version_of(rollout, p) == OLD for p in POPS)
    assert [e.kind for e in events] == ["gate_reading", "rolled_back"]
    rule = events[1].rule
    assert "node ewr-136 (Envoy 1.36.2) NACKed Cluster" in rule
    assert "Proto constraint validation failed" in rule and "next: fix the desired state" in rule


def test_a_long_nack_keeps_what_envoy_refused_and_why() -> None:
    """Envoy's message names the resource, echoes the refused config, then gives the reason:
    a record keeps the start and the end of it, bounded."""
    rollout = begin()
    message = ("Error adding/updating listener(s) edge: "
               + "processing_mode {\n  request_header_mode: SKIP\n}\n" * 60
               + ": Proto constraint validation failed (ProcessingModeValidationError."
               "RequestBodyMode: value must be one of the defined enum values)")
    nack = Nack("ewr", "ewr-136", NEW, "1.36.4", "t/Listener", message)
    _, events = look(rollout, replace(healthy(rollout), nacks=(nack,)), 1000, POLICY)
    rule = events[1].rule
    assert "NACKed Listener of version" in rule
    assert "Error adding/updating listener(s) edge:" in rule
    assert "value must be one of the defined enum values)" in rule
    assert f"[{len(message) - MAX_MESSAGE_CHARS:,} characters cut]" in rule
    assert len(rule) < len(NEXT_STEP_AFTER_ROLLBACK) + MAX_MESSAGE_CHARS + 250


def test_a_nack_of_another_version_does_not_count() -> None:
    rollout = begin()
    nack = Nack("sjc", "sjc-1", OLD, "1.40.0", "t/Cluster", "old news")
    gate = evaluate(replace(healthy(rollout), nacks=(nack,)), reached(rollout), NEW, 0, 1, GATES)
    assert gate.verdict == "pass"


def test_missing_acks_wait_then_fail_after_the_ack_timeout() -> None:
    rollout = begin()
    inputs = replace(healthy(rollout), nodes=(NodeAck("ewr", "ewr-1", NEW),
                                              NodeAck("ewr", "ewr-2", OLD)))
    gate = evaluate(inputs, reached(rollout), NEW, 0, GATES.ack_timeout_ms - 1, GATES)
    assert gate.verdict == "wait" and "node ewr-2 not ACKed yet" in gate.why[0]
    rollout, events = look(rollout, inputs, GATES.ack_timeout_ms, POLICY)
    assert rollout.phase == "rolled_back"
    assert "node ewr-2 not ACKed 60 s after the wave started" in events[-1].rule


def test_readings_name_the_replica_a_node_is_connected_to() -> None:
    rollout = begin()
    inputs = replace(healthy(rollout), nodes=(NodeAck("ewr", "ewr-1", NEW, "a"),
                                              NodeAck("ewr", "ewr-2", None, "b")))
    gate = evaluate(inputs, reached(rollout), NEW, 0, 1, GATES)
    assert gate.verdict == "wait" and "node ewr-2 (on replica b) not ACKed yet" in gate.why[0]
    nack = Nack("ewr", "ewr-2", NEW, "1.36.2", "t/Listener", "refused", replica="b")
    gate = evaluate(replace(inputs, nacks=(nack,)), reached(rollout), NEW, 0, 1, GATES)
    assert gate.verdict == "fail"
    assert "node ewr-2 (Envoy 1.36.2, on replica b) NACKed Listener" in gate.why[0], gate.why


def test_a_5xx_regression_against_both_baselines_rolls_back_naming_it() -> None:
    rollout = begin()
    inputs = healthy(rollout, ewr=signals(errors=40))
    rollout, events = look(rollout, inputs, 60_000, POLICY)
    assert rollout.phase == "rolled_back"
    assert "pop ewr shop/primary: 5xx 20.0% (40 of 200, lower bound 15.0%) vs old PoPs 0.0% " \
           "of 800 (regressed); before 0.0% of 200 (regressed); max increase 2.0%" \
        in events[-1].rule
    detail = events[-1].detail
    assert detail is not None and detail["failed_version"] == NEW
    assert {(r["signal"], r["key"]) for r in detail["failing"]} == {
        ("5xx", "shop/primary"), ("5xx", "all")}


def test_an_increase_the_old_pops_share_is_not_blamed_on_the_change() -> None:
    """An origin incident: the old PoPs' 5xx rose as much: the wave's reading passes."""
    rollout = begin()
    sick = signals(errors=40)
    inputs = replace(healthy(rollout, ewr=sick),
                     peers=tuple(window(p, sick) for p in POPS[1:]))
    gate = evaluate(inputs, reached(rollout), NEW, 0, BAKE, GATES)
    assert gate.verdict == "pass"


def test_a_route_to_a_failing_new_group_fails_without_a_baseline_of_its_own() -> None:
    """The change sends the canary's traffic to a group nothing served before, whose origin
    answers 5xx: no per-origin baseline, so it is judged against a rate of 0 (the weight
    controller's breach rule); the PoP's overall 5xx rate regresses too."""
    wrong = PopWindow("ewr", (("shop", "primary", signals(requests=20)),
                              ("wrong", "primary", signals(requests=180, errors=180))))
    inputs = GateInputs(nodes=(NodeAck("ewr", "n1", NEW),), after=(wrong,),
                        before=(window("ewr"),), peers=(window("sjc"),))
    gate = evaluate(inputs, {"ewr"}, NEW, 0, BAKE, GATES)
    failing = {r.key: r.text for r in gate.readings if r.verdict == "fail"}
    assert set(failing) == {"all", "wrong/primary"}
    assert "vs new, nothing before 0.0% of 10 (regressed)" in failing["wrong/primary"]
    assert "5xx 90.0% (180 of 200" in failing["all"]


def test_the_pops_overall_rate_gives_evidence_when_each_origin_is_thin() -> None:
    thin = PopWindow("ewr", tuple(("shop", f"o{i}", signals(requests=5)) for i in range(4)))
    inputs = GateInputs(nodes=(NodeAck("ewr", "n1", NEW),), after=(thin,),
                        before=(replace(thin, pop="ewr"),))
    gate = evaluate(inputs, {"ewr"}, NEW, 0, BAKE, GATES)
    assert gate.verdict == "pass"
    assert [r.key for r in gate.readings if r.verdict == "pass" and r.signal == "5xx"] == ["all"]


@pytest.mark.parametrize(("after", "before", "peer", "verdict"), [
    (signals(p95=400), signals(p95=100), signals(p95=100), "fail"),
    # over the ratio but within the minimum increase
    (signals(p95=40), signals(p95=10), signals(p95=10), "pass"),
    # the lower bound is not over: too few slow samples
    (signals(p95=400, p95_low=120), signals(p95=100), signals(p95=100), "inconclusive"),
    (signals(p95=120), signals(p95=100), signals(p95=100), "pass"),
    (signals(requests=5, p95=400), signals(p95=100), signals(p95=100), "inconclusive"),
])
def test_p95_readings(after: OriginSignals, before: OriginSignals, peer: OriginSignals,
                      verdict: str) -> None:
    inputs = GateInputs(after=(window("ewr", after),), before=(window("ewr", before),),
                        peers=(window("sjc", peer),))
    gate = evaluate(inputs, {"ewr"}, NEW, 0, BAKE, GATES)
    assert next(r for r in gate.readings if r.signal == "p95").verdict == verdict


@pytest.mark.parametrize(("after", "before", "verdict"), [
    (TierShed(200, 100), TierShed(200, 0), "fail"),
    (TierShed(200, 4), TierShed(200, 0), "pass"),
    (TierShed(5, 5), TierShed(200, 0), "inconclusive"),
])
def test_shed_readings(after: TierShed, before: TierShed, verdict: str) -> None:
    inputs = GateInputs(after=(window("ewr", shed=after),), before=(window("ewr", shed=before),))
    gate = evaluate(inputs, {"ewr"}, NEW, 0, BAKE, GATES)
    assert next(r for r in gate.readings if r.signal == "shed").verdict == verdict


def test_a_tier_action_onset_only_the_wave_has_fails() -> None:
    inputs = GateInputs(nodes=(NodeAck("ewr", "ewr-1", NEW),),
                        after=(window("ewr", onsets=1),), before=(window("ewr"),),
                        peers=(window("sjc"),))
    gate = evaluate(inputs, {"ewr"}, NEW, 0, BAKE, GATES)
    assert gate.verdict == "fail" and "1 tier-action onset(s)" in gate.why[0]
    with_peer = replace(inputs, peers=(window("sjc", onsets=1),))
    assert evaluate(with_peer, {"ewr"}, NEW, 0, BAKE, GATES).verdict == "pass"


def test_without_evidence_the_bake_extends_then_the_gates_pause() -> None:
    rollout = begin()
    quiet = healthy(rollout, ewr=signals(requests=3))
    rollout, events = look(rollout, quiet, BAKE, POLICY)
    assert [e.kind for e in events] == ["gate_reading"] and rollout.phase == "baking"
    assert rollout.gate is not None
    assert rollout.gate.verdict == "wait" and "pop ewr: no evidence yet" in rollout.gate.why[0]
    timeout = BAKE + GATES.evidence_timeout_ms
    rollout, events = look(rollout, quiet, timeout, POLICY)
    assert rollout.phase == "paused" and [e.kind for e in events] == ["rollout_paused"]
    assert "resume to wait again, promote or abort" in rollout.reason
    assert version_of(rollout, "ewr") == NEW and version_of(rollout, "sjc") == OLD


def test_a_wave_without_a_connected_node_waits_then_pauses() -> None:
    """Issue 33: a canary with no connected node 'passed: every node ACKed'; nothing served
    the version, so there is nothing to judge: it waits, and pauses after the evidence
    timeout as for no evidence."""
    rollout = begin()
    gate = evaluate(GateInputs(), reached(rollout), NEW, 0, BAKE, GATES)
    assert gate.verdict == "wait"
    assert gate.why == (f"no node of ewr is connected: nothing serves version {NEW[:16]} to "
                        "judge yet",)
    rollout, events = look(rollout, GateInputs(), BAKE + GATES.evidence_timeout_ms, POLICY)
    assert rollout.phase == "paused" and [e.kind for e in events] == ["rollout_paused"]


def test_a_pop_without_nodes_beside_one_with_nodes_needs_no_evidence() -> None:
    rollout = begin()
    both = healthy(rollout)
    gate = evaluate(both, reached(rollout) | {"lax"}, NEW, 0, BAKE, GATES)
    assert gate.verdict == "pass", gate


def test_a_rate_is_never_above_its_count() -> None:
    """Issue 33: a rolled_back record read '5xx 101.4 % (75 of 74)'."""
    over = window("ewr", signals(requests=74, errors=75))
    gate = evaluate(GateInputs(nodes=(NodeAck("ewr", "ewr-1", NEW),), after=(over,),
                               before=(window("ewr"),)), {"ewr"}, NEW, 0, BAKE, GATES)
    assert gate.verdict == "fail"
    assert "5xx 100.0% (74 of 74" in gate.why[0], gate.why


# --- operator actions --------------------------------------------------------------------------

def test_pause_holds_the_wave_resume_bakes_again_a_failure_still_rolls_back() -> None:
    rollout, events = pause(begin(), 10, by="alice")
    assert rollout.phase == "paused" and events[0].kind == "rollout_paused"
    assert rollout.reason == "paused by alice in wave 1 of 3"
    held, events = look(rollout, healthy(rollout), 10 * BAKE, POLICY)
    assert held.phase == "paused" and held.wave == 0
    assert [e.kind for e in events] == ["gate_reading"]
    with pytest.raises(RolloutError, match="paused already"):
        pause(rollout, 20)
    resumed, events = resume(rollout, 100, by="alice")
    assert resumed.phase == "baking" and resumed.wave_started_ms == 100
    assert events[0].kind == "rollout_resumed"
    failed, _ = look(rollout, healthy(rollout, ewr=signals(errors=100)), 30, POLICY)
    assert failed.phase == "rolled_back"


def test_abort_rolls_back_and_promote_finishes() -> None:
    rollout, _ = look(begin(), healthy(begin()), BAKE, POLICY)
    aborted, events = abort(rollout, BAKE + 1, by="bob")
    assert aborted.phase == "aborted" and failed_version(aborted) == NEW
    assert all(version_of(aborted, p) == OLD for p in POPS)
    assert events[0].kind == "rollout_aborted" and events[0].pops == ("ewr", "lhr", "sjc")
    promoted, events = promote(rollout, BAKE + 1, by="bob")
    assert promoted.phase == "passed" and all(version_of(promoted, p) == NEW for p in POPS)
    assert events[0].kind == "rollout_promoted" and events[0].pops == ("fra", "nrt")
    assert "promoted by bob in wave 2 of 3" in events[0].rule
    for action in (pause, resume, abort, promote):
        with pytest.raises(RolloutError, match="not in progress"):
            action(promoted, BAKE + 2)


# --- supersede ---------------------------------------------------------------------------------

def test_a_new_version_supersedes_from_the_last_passed_version() -> None:
    rollout, _ = look(begin(), healthy(begin()), BAKE, POLICY)  # ewr, sjc, lhr on NEW
    ended, new, events = supersede(rollout, POLICY, NEWER, POPS, POPS, BAKE + 5, by="file")
    assert ended.phase == "superseded" and version_of(ended, "sjc") == OLD
    assert (new.from_version, new.to_version, new.phase, new.wave) == (OLD, NEWER, "baking", 0)
    assert {p: version_of(new, p)[0] for p in POPS} == {
        "ewr": "c", "sjc": "a", "lhr": "a", "fra": "a", "nrt": "a"}
    assert [e.kind for e in events] == ["rollout_superseded", "rollout_started", "wave_started"]
    assert "ewr, lhr, sjc leave" in events[0].rule


def test_supersede_edge_cases() -> None:
    rollout = begin()
    assert supersede(rollout, POLICY, NEW, POPS, POPS, 5) == (rollout, rollout, ())
    _, reverted, events = supersede(rollout, POLICY, OLD, POPS, POPS, 5)
    assert reverted.phase == "passed" and all(version_of(reverted, p) == OLD for p in POPS)
    assert "last version that passed" in events[-1].rule
    passed, _ = promote(rollout, 1)
    ended, new, events = supersede(passed, POLICY, NEWER, POPS, POPS, 5)
    assert ended == passed and new.from_version == NEW
    assert [e.kind for e in events] == ["rollout_started", "wave_started"]
    _, now, _ = supersede(rollout, POLICY, NEWER, POPS, POPS, 5, immediate=True)
    assert now.phase == "passed" and now.immediate


def test_timeline_and_when_each_pop_got_the_new_version() -> None:
    rollout, _ = look(begin(), healthy(begin()), BAKE, POLICY)  # wave 2 started at BAKE
    paused, _ = pause(rollout, BAKE + 10)
    assert [(w["wave"], w["state"], w["started_ms"]) for w in timeline(paused)] == [
        (1, "passed", 0), (2, "paused", BAKE), (3, "pending", None)]
    resumed, _ = resume(paused, BAKE + 20)
    assert timeline(resumed)[1]["started_ms"] == BAKE  # the first start, not the resume
    assert [serving_since(resumed, p) for p in POPS] == [0, BAKE, BAKE, None, None]
    promoted, _ = promote(resumed, BAKE + 30)
    assert [(w["state"], w["started_ms"]) for w in timeline(promoted)] == [
        ("passed", 0), ("promoted", BAKE), ("promoted", BAKE + 30)]
    assert serving_since(promoted, "nrt") == BAKE + 30
    failed, _ = look(resumed, healthy(resumed, sjc=signals(errors=90)), BAKE + 40, POLICY)
    assert [w["state"] for w in timeline(failed)] == ["passed", "rolled_back", "pending"]
    assert all(serving_since(failed, p) is None for p in POPS)
    now, _ = start(POLICY, OLD, NEW, POPS, POPS, 7, immediate=True)
    assert timeline(now) == [{"wave": 1, "pops": list(POPS), "state": "passed",
                              "started_ms": 7}]


# --- storage and replay ------------------------------------------------------------------------

def test_to_dict_round_trips_and_corrupt_state_is_refused() -> None:
    rollout, _ = look(begin(), healthy(begin(), ewr=signals(requests=3)), BAKE, POLICY)
    assert Rollout.from_dict(rollout.to_dict()) == rollout
    for bad in ({"phase": "gone"}, {"wave": 7}, {"waves": [["ewr"], []]},
                {"waves": [["ewr"], ["ewr"]]}, {"to_version": ""}, {"from_version": "x" * 129},
                {"wave_starts": [0, 1, 2]}):
        with pytest.raises(ValueError):
            Rollout.from_dict(rollout.to_dict() | bad)


def test_a_step_is_replayed_from_its_record() -> None:
    rollout = begin()
    for now, inputs in ((BAKE, healthy(rollout)), (2 * BAKE, None)):
        inputs = inputs or healthy(rollout, sjc=signals(errors=50))
        after, events = look(rollout, inputs, now, POLICY)
        written = json.loads(json.dumps(events[0].record_fields()))  # as the log holds it
        assert replay_look(written["detail"], POLICY) == (after, events)
        rollout = after
    assert rollout.phase == "rolled_back"


# --- properties --------------------------------------------------------------------------------

ACTIONS = st.lists(st.tuples(
    st.sampled_from(["pass", "fail", "wait", "pause", "resume", "abort", "promote"]),
    st.integers(0, 2 * BAKE)), max_size=25)


@settings(max_examples=300, deadline=None)
@given(pops=st.integers(1, 8), actions=ACTIONS)
def test_pops_get_the_new_version_only_when_their_wave_is_reached(
        pops: int, actions: list[tuple[str, int]]) -> None:
    names = tuple(f"p{i}" for i in range(pops))
    rollout, _ = start(POLICY, OLD, NEW, names, names, 0)
    now = 0
    for action, wait in actions:
        now += wait
        before = rollout
        if action in ("pass", "fail", "wait"):
            rollout, _ = advance(rollout, GateResult(action, ("x",)), now, POLICY)  # type: ignore[arg-type]
        elif rollout.in_progress and (action != "pause" or rollout.phase == "baking") and (
                action != "resume" or rollout.phase == "paused"):
            rollout, _ = {"pause": pause, "resume": resume, "abort": abort,
                          "promote": promote}[action](rollout, now)
        else:
            with pytest.raises(RolloutError):
                {"pause": pause, "resume": resume, "abort": abort,
                 "promote": promote}[action](rollout, now)
        # progress only by a passing gate after a full bake, or by promote
        if rollout.wave > before.wave:
            assert action == "pass" and before.phase == "baking"
            assert now - before.wave_started_ms >= BAKE
            assert rollout.wave == before.wave + 1
        if before.phase == "paused" and action not in ("resume", "promote"):
            assert rollout.wave == before.wave and rollout.phase != "passed"
        for index, wave in enumerate(rollout.waves):
            for pop in wave:
                version = version_of(rollout, pop)
                if rollout.phase == "passed":
                    assert version == NEW
                elif rollout.phase in ("rolled_back", "aborted", "superseded"):
                    assert version == OLD  # the last passed version, everywhere
                else:
                    assert (version == NEW) == (index <= rollout.wave)
        if action == "fail" and before.in_progress:
            assert rollout.phase == "rolled_back"
        if action == "promote" and before.in_progress:
            assert rollout.phase == "passed"


OPTIONAL_INT = st.integers(0, 400)


@st.composite
def origin_signals(draw: st.DrawFn) -> OriginSignals:
    requests = draw(OPTIONAL_INT)
    return signals(requests=requests, errors=draw(st.integers(0, requests)),
                   p95=draw(st.floats(1, 5000)))


@settings(max_examples=300, deadline=None)
@given(after=origin_signals(), before=origin_signals(), peer=origin_signals(),
       onsets=st.integers(0, 3), acked=st.booleans(), now=st.integers(0, 10 * BAKE))
def test_a_nack_always_fails(after: OriginSignals, before: OriginSignals, peer: OriginSignals,
                             onsets: int, acked: bool, now: int) -> None:
    inputs = GateInputs(
        nodes=(NodeAck("ewr", "n1", NEW if acked else OLD),),
        nacks=(Nack("ewr", "n1", NEW, "1.36.2", "t/Listener", "rejected"),),
        after=(window("ewr", after, onsets),), before=(window("ewr", before),),
        peers=(window("sjc", peer),))
    gate = evaluate(inputs, {"ewr"}, NEW, 0, now, GATES)
    assert gate.verdict == "fail"
    assert any("NACKed Listener" in why for why in gate.why)


@settings(max_examples=300, deadline=None)
@given(requests=st.integers(0, GATES.min_samples - 1), data=st.data(),
       before=origin_signals(), peer=origin_signals())
def test_a_window_without_evidence_neither_passes_nor_fails(
        requests: int, data: st.DataObject, before: OriginSignals, peer: OriginSignals) -> None:
    thin = signals(requests=requests, errors=data.draw(st.integers(0, requests)),
                   p95=data.draw(st.floats(1, 5000)))
    inputs = GateInputs(nodes=(NodeAck("ewr", "n1", NEW),), after=(window("ewr", thin),),
                        before=(window("ewr", before),), peers=(window("sjc", peer),))
    gate = evaluate(inputs, {"ewr"}, NEW, 0, BAKE, GATES)
    for reading in gate.readings:
        if reading.signal in ("5xx", "p95"):
            assert reading.verdict == "inconclusive"
    assert gate.verdict == "wait"  # nothing fails; the PoP has no evidence yet


@settings(max_examples=200, deadline=None)
@given(after=origin_signals(), before=origin_signals(), peer=origin_signals())
def test_a_baseline_without_evidence_decides_nothing(after: OriginSignals,
                                                     before: OriginSignals,
                                                     peer: OriginSignals) -> None:
    """Adding a baseline with too few samples never changes a reading's verdict."""
    base = GateInputs(after=(window("ewr", after),), before=(window("ewr", before),))
    thin = replace(base, peers=(window("sjc", signals(requests=GATES.min_samples - 1)),))
    one = evaluate(base, {"ewr"}, NEW, 0, BAKE, RolloutGates())
    two = evaluate(thin, {"ewr"}, NEW, 0, BAKE, RolloutGates())
    verdicts = {(r.signal, r.key): r.verdict for r in one.readings if r.signal != "tier_actions"}
    assert verdicts == {(r.signal, r.key): r.verdict for r in two.readings
                        if r.signal != "tier_actions"}


STEPS = st.lists(st.tuples(
    st.sampled_from(["pass", "fail", "wait", "pause", "resume", "abort", "promote", "edit",
                     "edit_now"]),
    st.integers(0, 2 * BAKE)), max_size=30)


@settings(max_examples=300, deadline=None)
@given(pops=st.integers(1, 6), steps=STEPS)
def test_every_pop_serves_the_last_passed_version_or_the_one_rolling_out(
        pops: int, steps: list[tuple[str, int]]) -> None:
    """Through edits (supersedes), gate results and operator actions: every PoP serves the last
    version that passed or the one rolling out (only once its wave is reached); a rollback or
    an abort puts every PoP on the last passed version; every step replays from its record."""
    names = tuple(f"p{i}" for i in range(pops))
    versions = iter(f"{n:064x}" for n in range(2, 100))
    rollout, _ = start(POLICY, OLD, next(versions), names, names, 0)
    good, now = OLD, 0
    for action, wait in steps:
        now += wait
        if action in ("pass", "fail", "wait"):
            gate = GateResult(action, ("why",))  # type: ignore[arg-type]
            after, events = advance(rollout, gate, now, POLICY)
            for event in events:
                if event.detail is not None and "before" in event.detail:
                    assert replay_look(event.detail, POLICY) == (after, events)
            rollout = after
        elif action in ("edit", "edit_now"):
            _, rollout, _ = supersede(rollout, POLICY, next(versions), names, names, now,
                                      immediate=action == "edit_now")
        elif rollout.in_progress:
            try:
                rollout, _ = {"pause": pause, "resume": resume, "abort": abort,
                              "promote": promote}[action](rollout, now)
            except RolloutError:
                assert (action, rollout.phase) in (("pause", "paused"), ("resume", "baking"))
        if rollout.phase == "passed":
            good = rollout.to_version
        assert last_passed(rollout) == good
        served = {version_of(rollout, pop) for pop in names}
        assert served <= {good, rollout.to_version}
        if rollout.phase in ("rolled_back", "aborted"):
            assert served == {good} and failed_version(rollout) == rollout.to_version
        for index, wave in enumerate(rollout.waves):
            for pop in wave:
                if version_of(rollout, pop) == rollout.to_version != good:
                    assert rollout.phase == "passed" or index <= rollout.wave


def test_the_reasons_stay_bounded_however_many_pops_fail() -> None:
    pops = [f"p{i}" for i in range(40)]
    inputs = GateInputs(nacks=tuple(Nack(p, f"{p}-1", NEW, "1.36.2", "t/Cluster", "no " * 400)
                                    for p in pops))
    gate = evaluate(inputs, pops, NEW, 0, 1, GATES)
    assert gate.verdict == "fail" and len(gate.why) == 6
    assert gate.why[-1] == "... and 35 more failing readings"
    assert len(gate.readings) == 20 and dict(gate.counts) == {"fail": 40}
    assert max(len(w) for w in gate.why) < 700


@st.composite
def any_signals(draw: st.DrawFn) -> OriginSignals:
    requests = draw(st.integers(0, 500))
    p95 = draw(st.none() | st.floats(0, 10_000))
    return OriginSignals(
        requests=requests, errors_5xx=draw(st.integers(0, requests)),
        connect_failures=draw(st.integers(0, 50)),
        p50_ms=None if p95 is None else p95 / 2, p95_ms=p95, pending_active=0,
        queue_overflow=0, probe_success=draw(st.none() | st.floats(0, 1)),
        observed_at_ms=0, latency_samples=draw(st.none() | st.integers(0, 500)),
        p95_low_ms=None if p95 is None else draw(st.none() | st.floats(0, p95)),
        probes=draw(st.integers(0, 12)))


@st.composite
def any_window(draw: st.DrawFn, pop: str) -> PopWindow:
    origins = draw(st.lists(st.tuples(st.sampled_from(["shop", "api"]),
                                      st.sampled_from(["primary", "secondary"]), any_signals()),
                            max_size=4, unique_by=lambda o: o[:2]))
    tiers = draw(st.lists(st.tuples(st.just("shop"), st.sampled_from(["normal", "background"]),
                                    st.integers(0, 300).flatmap(lambda n: st.builds(
                                        TierShed, st.just(n), st.integers(0, n)))),
                          max_size=2, unique_by=lambda t: t[:2]))
    return PopWindow(pop, tuple(origins), tuple(tiers), draw(st.integers(0, 3)))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), reached_pops=st.sets(st.sampled_from(POPS), min_size=1),
       now=st.integers(0, 3 * BAKE))
def test_the_gate_verdict_follows_from_its_readings(data: st.DataObject,
                                                    reached_pops: set[str], now: int) -> None:
    """Whatever the windows hold: fail iff a reading fails; pass only with nothing to wait for
    and evidence from every PoP with nodes; the counts cover every reading."""
    nodes = tuple(NodeAck(p, f"{p}-1", data.draw(st.sampled_from([NEW, OLD, None])))
                  for p in sorted(reached_pops) if data.draw(st.booleans()))
    inputs = GateInputs(
        nodes=nodes,
        nacks=tuple(Nack(p, f"{p}-1", data.draw(st.sampled_from([NEW, OLD])), "1.36", "t/X",
                         "m") for p in data.draw(st.sets(st.sampled_from(POPS), max_size=1))),
        after=tuple(data.draw(any_window(p)) for p in sorted(reached_pops)),
        peers=tuple(data.draw(any_window(p)) for p in POPS if p not in reached_pops),
        before=tuple(data.draw(any_window(p)) for p in sorted(reached_pops)
                     if data.draw(st.booleans())))
    gate = evaluate(inputs, reached_pops, NEW, 0, now, GATES)
    counts = dict(gate.counts)
    assert (gate.verdict == "fail") == (counts.get("fail", 0) > 0)
    if gate.verdict == "pass":
        assert counts.get("wait", 0) == 0
        assert all(n.acked == NEW for n in nodes)
        measured = {r.pop for r in gate.readings if r.verdict == "pass"}
        assert {n.pop for n in nodes} <= measured or sum(counts.values()) > len(gate.readings)
    assert len(gate.readings) == min(sum(counts.values()), 20)
    assert GateResult.from_dict(json.loads(json.dumps(gate.to_dict()))) == gate
