"""`explain`: the chain of decisions, with numbers, and what moves the weights next; then the
tier actions active now, what switched them on and what lifts them."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from control_plane.decide.controller import ControllerState, home_weights, step
from control_plane.decide.runs import END_KINDS, QuietRun, follow_run
from control_plane.decide.signals import OriginSignals, TierPending
from control_plane.decide.tiers import TierState, tier_step
from control_plane.decisions.explain import describe_active, explain, explain_tiers
from control_plane.decisions.log import DecisionLog
from control_plane.decisions.read import iter_records
from control_plane.desired.model import FailoverPolicy, OriginGroup, TierActionPolicy, TierActions
from harness.models import shop_group

POLICY = FailoverPolicy()
PREF = ("primary", "secondary")
T0 = datetime(2024, 5, 1, 16, 0, tzinfo=UTC)
TICK = 20_000


def sig(now: int, errors: int = 0, p95: float = 120.0, age: int = 0) -> OriginSignals:
    return OriginSignals(1000, errors, 0, 40.0, p95, 0.0, 0, None, now - age)


def incident(tmp_path: Path, phases: list[tuple[str, int]], *, runs: bool = False) -> list[dict]:
    """Run the controller through phases (sick | healthy | stale, ticks) and log every tick, or
    with `runs` like the app: quiet runs at their start and end (`decide/runs.py`)."""
    now = [T0]
    weights, state, tick = home_weights(PREF, 5), ControllerState(), 0
    run: QuietRun | None = None
    with DecisionLog(tmp_path, clock=lambda: now[0]) as log:
        for phase, ticks in phases:
            for _ in range(ticks):
                tick += 1
                ms = tick * TICK
                now[0] = T0 + timedelta(milliseconds=ms)
                primary = {
                    "sick": sig(ms, errors=79, p95=1440.0),
                    "healthy": sig(ms),
                    "stale": sig(ms, age=45_000 + TICK * ticks),
                }[phase]
                result = step(POLICY, PREF, weights, state,
                              {"primary": primary, "secondary": sig(ms)}, ms, 0)
                logged = follow_run(run, result, ms, first_tick=tick == 1)
                if runs and logged.ended is not None:
                    log.record(END_KINDS[logged.ended.kind], pop="ewr", group="api",
                               **logged.ended.end_fields(result.kind))
                run = logged.run
                if logged.write_tick or not runs:
                    log.record(result.kind, pop="ewr", group="api", config_version="v1",
                               **result.record_fields())
                log.record("steady", pop="sjc", group="api", weights_before=home_weights(PREF, 5),
                           weights_after=home_weights(PREF, 5))
                weights, state = result.weights_after, result.state
    return list(iter_records(tmp_path))


def test_explains_a_shift_with_numbers(tmp_path: Path) -> None:
    text = explain(incident(tmp_path, [("healthy", 1), ("sick", 3)]), "ewr", "api")
    lines = text.splitlines()
    assert lines[0] == ("pop ewr, group api: weights now primary 75, secondary 25 "
                        "(since 2024-05-01 16:01:20 UTC, seq 7)")
    assert "16:00:40 threshold_breach: primary 5xx 7.9% > 2%, p95 1440 ms > 800 ms " \
           "(window 1 of 2)" in text
    assert ("16:01:00 weight_shift: primary 95→85, secondary 5→15 (primary 5xx 7.9% > 2%"
            in text)
    assert "score 0.21 = min(errors 0.21, latency 0.64, saturation 1.00)" in text
    assert "step cap 10" in text
    assert "16:01:20 weight_shift: primary 85→75, secondary 15→25" in text
    assert lines[-2].startswith("next: health_proportional: keeps moving up to 10 per interval")
    assert lines[-1] == "tier actions: no tier actions active (none switched on in the log)"
    assert "latest scores: primary 0.21 (lowest: errors); secondary" in text
    assert "sjc" not in text


def test_explains_a_hold_and_the_wait_for_return(tmp_path: Path) -> None:
    records = incident(tmp_path, [("sick", 3), ("healthy", 1)])
    text = explain(records, "ewr", "api")
    assert "held since 16:01:20: held away from home: return waits for 3 healthy windows" in text
    assert text.splitlines()[-2] == "next: return to primary starts after 3 healthy windows; " \
                                    "1 of 3 so far"


def test_folds_stale_holds_into_one_line(tmp_path: Path) -> None:
    text = explain(incident(tmp_path, [("sick", 3), ("stale", 3)]), "ewr", "api")
    assert ("held since 16:01:20: fail static: metrics stale 105 s (primary); weights held "
            "(3 ticks, last at 16:02:00)") in text
    assert "next: weights stay until every origin reports metrics newer than 45 s" in text


def test_a_logged_run_of_holds_is_one_line_with_its_tick_count(tmp_path: Path) -> None:
    records = incident(tmp_path, [("sick", 3), ("stale", 4), ("sick", 1)], runs=True)
    ewr = [r["kind"] for r in records if r["pop"] == "ewr"]
    assert ewr[-3:] == ["hold", "hold_ended", "weight_shift"], ewr  # 4 ticks, 2 records
    text = explain(records, "ewr", "api")
    assert ("16:01:20 held (4 ticks, last at 16:02:40): fail static: metrics stale 125 s "
            "(primary); weights held") in text, text
    ongoing = explain(incident(tmp_path / "2", [("sick", 3), ("stale", 3)], runs=True),
                      "ewr", "api")
    assert "held since 16:01:20: fail static: metrics stale 105 s (primary); weights held" \
        in ongoing, ongoing


def test_calm_after_return_home(tmp_path: Path) -> None:
    records = incident(tmp_path, [("sick", 3), ("healthy", 8)])
    text = explain(records, "ewr", "api")
    assert "weights now primary 95, secondary 5" in text
    assert "calm: at the preferred split since 16:03:00 (return, seq 17)" in text
    assert "how they got here" not in text


def test_no_records(tmp_path: Path) -> None:
    assert explain([], "ewr", "api") == "no decisions for pop ewr, group api"


# -- tier actions ----------------------------------------------------------------------------

TIERS = TierActionPolicy(trigger="pending", lending=False)  # critical pending > 10 for 30 s;
# lifted after 60 s without
TIER_TICK = 15_000
DISABLED = replace(TIERS, enabled=False)
SHED_ONLY = replace(TIERS, for_ms=0, demote_tier=None, recover_after_ms=120_000)
OFF_LINE = (
    "  off: once 60 s (recover_after) pass without critical pending max > 10, or when tier "
    "actions are disabled in the desired state"
)
ON_AT_0045 = [
    "tier actions: normal: 50% demoted to background (answered at the edge: background is "
    "shed) since 16:00:45; background: shed to its floor of 6 slot(s) (503 beyond) since "
    "16:00:45",
    "  switched on at 16:00:45 (tier_action, seq 2): critical pending max 25 > 10 "
    "(trigger_pending) at every tick for 30 s since 16:00:15 (for: 30 s)",
    OFF_LINE,
]
def group_with(policy: TierActionPolicy) -> OriginGroup:
    return replace(shop_group(), tier_actions=policy)


NONE = ["tier actions: no tier actions active (none switched on in the log)"]


def tier_log(tmp_path: Path, ticks: list[float | tuple[TierActionPolicy, float]]) -> list[dict]:
    """A steady weights record, then the tier step over `ticks` (a pending peak of the critical
    tier, optionally with the policy of that tick), logged like the reconcile loop: a record only
    when the actions go on or off."""
    now = [T0]
    state = TierState()
    with DecisionLog(tmp_path, clock=lambda: now[0]) as log:
        log.record("steady", pop="ewr", group="api", weights_before=home_weights(PREF, 5),
                   weights_after=home_weights(PREF, 5), rule="at home",
                   inputs={"home": home_weights(PREF, 5)})
        for tick, entry in enumerate(ticks, start=1):
            policy, pending = entry if isinstance(entry, tuple) else (TIERS, entry)
            ms = tick * TIER_TICK
            now[0] = T0 + timedelta(milliseconds=ms)
            result = tier_step(group_with(policy), state,
                               {"critical": TierPending(pending, ms)}, ms)
            if result.kind is not None:
                log.record(result.kind, pop="ewr", group="api",
                           **result.record_fields(result.decisions[0]))
            state = result.state
    return list(iter_records(tmp_path))


@pytest.mark.parametrize(
    ("case", "ticks", "expected"),
    [
        ("never triggered", [3, 3, 3], NONE),
        ("triggered, not yet for 30 s", [25, 25], NONE),
        ("held 30 s: on", [25, 25, 25], ON_AT_0045),
        ("quiet 30 s of 60: still on", [25, 25, 25, 3, 3, 3], ON_AT_0045),
        ("quiet 60 s: lifted", [25, 25, 25, 3, 3, 3, 3, 3], [
            "tier actions: no tier actions active; the last ended at 16:02:00 (seq 3): critical "
            "pending max 3 ≤ 10 for 60 s (≥ recover_after 60 s): lifted (demote 50% of normal to "
            "background (answered at the edge while background is shed), shed background to "
            "its floor (503 beyond))",
        ]),
        ("on again after a lift", [25, 25, 25, 3, 3, 3, 3, 3, 40, 40, 40], [
            "tier actions: normal: 50% demoted to background (answered at the edge: background "
            "is shed) since 16:02:45; background: shed to its floor of 6 slot(s) (503 beyond) "
            "since 16:02:45",
            "  switched on at 16:02:45 (tier_action, seq 4): critical pending max 40 > 10 "
            "(trigger_pending) at every tick for 30 s since 16:02:15 (for: 30 s)",
            OFF_LINE,
        ]),
        ("disabled in the desired state", [25, 25, 25, (DISABLED, 40)], [
            "tier actions: no tier actions active; the last ended at 16:01:00 (seq 3): tier "
            "actions disabled in the desired state: lifted (demote 50% of normal to background "
            "(answered at the edge while background is shed), shed background to its floor "
            "(503 beyond))",
        ]),
        ("shed only, for 0 s", [(SHED_ONLY, 3), (SHED_ONLY, 11)], [
            "tier actions: background: shed to its floor of 6 slot(s) (503 beyond) since "
            "16:00:30",
            "  switched on at 16:00:30 (tier_action, seq 2): critical pending max 11 > 10 "
            "(trigger_pending) at every tick for 0 s since 16:00:30 (for: 0 s)",
            "  off: once 120 s (recover_after) pass without critical pending max > 10, or when "
            "tier actions are disabled in the desired state",
        ]),
    ],
)
def test_tier_actions_table(
    tmp_path: Path, case: str, ticks: list[float | tuple[TierActionPolicy, float]],
    expected: list[str],
) -> None:
    records = tier_log(tmp_path, ticks)
    assert explain_tiers(records, "ewr", "api") == expected, case
    text = explain(records, "ewr", "api").splitlines()
    assert text[0] == ("pop ewr, group api: weights now primary 95, secondary 5 "
                       "(since 2024-05-01 16:00:00 UTC, seq 1)")
    assert text[1] == "calm: at the preferred split since 16:00:00 (steady, seq 1)", case
    assert text[2:] == expected, case
    assert explain_tiers(records, "sjc", "api") == NONE
    assert explain_tiers(records, "ewr", "media") == NONE


def test_tier_records_do_not_disturb_the_weights_story(tmp_path: Path) -> None:
    records = incident(tmp_path, [("sick", 3), ("healthy", 8)])
    clock = [T0 + timedelta(minutes=10)]
    with DecisionLog(tmp_path, clock=lambda: clock[0]) as log:
        result = tier_step(group_with(TIERS), TierState(trigger_since_ms=0),
                           {"critical": TierPending(30, 600_000)}, 600_000)
        log.record("tier_action", pop="ewr", group="api",
                   **result.record_fields(result.decisions[0]))
    records = list(iter_records(tmp_path))
    text = explain(records, "ewr", "api")
    assert "calm: at the preferred split since 16:03:00 (return, seq 17)" in text
    assert "how they got here" not in text and "16:10:00 tier_action" not in text
    assert ("tier actions: normal: 50% demoted to background (answered at the edge: background "
            "is shed) since 16:10:00") in text
    assert "for 600 s since 16:00:00 (for: 30 s)" in text
    assert "latest scores: primary" in text  # from the last weights record, not the tier one


def test_only_tier_records(tmp_path: Path) -> None:
    clock = [T0]
    with DecisionLog(tmp_path, clock=lambda: clock[0]) as log:
        result = tier_step(group_with(replace(TIERS, for_ms=0)), TierState(),
                           {"critical": TierPending(12.5, 0)}, 0)
        log.record("tier_action", pop="ewr", group="api",
                   **result.record_fields(result.decisions[0]))
    lines = explain(list(iter_records(tmp_path)), "ewr", "api").splitlines()
    assert lines[0] == "pop ewr, group api: no weights decided yet"
    assert lines[1].startswith("tier actions: normal: 50% demoted to background (answered at the "
                               "edge: background is shed) since 16:00:00")
    assert "critical pending max 12.5 > 10 (trigger_pending) at every tick for 0 s" in lines[2]


def test_tier_record_without_numbers_falls_back_to_its_rule() -> None:
    record = {"seq": 9, "time": "2024-05-01T16:05:00Z", "kind": "tier_action", "pop": "ewr",
              "group": "api", "rule": "switched on by hand",
              "detail": {"active": True, "actions": TierActions().to_dict()}}
    assert explain_tiers([record], "ewr", "api") == [
        "tier actions: normal: 50% demoted to background (answered at the edge: background is "
        "shed) since 16:05:00; background: shed to its floor (503 beyond) since 16:05:00",
        "  switched on at 16:05:00 (tier_action, seq 9): switched on by hand",
        "  off: once 60 s (recover_after) pass without the trigger, or when tier actions "
        "are disabled in the desired state",
    ]


@pytest.mark.parametrize(
    ("actions", "words"),
    [
        (TierActions(), "normal: 50% demoted to background (answered at the edge: background "
                        "is shed); background: shed to its floor (503 beyond)"),
        (TierActions(shed_tier=None, demote_share=50, limits=(("critical", 18), ("normal", 1)),
                     pending_limits=(("critical", 30),)),
         "normal: 50% demoted to background; limits: critical 18, normal 1; queue bounded in "
         "time: critical at most 30 pending"),
        (TierActions(shed_tier=None, demote_share=25), "normal: 25% demoted to background"),
        (TierActions(demote_tier=None, demote_share=0, retry_after_s=5),
         "background: shed to its floor (503 beyond)"),
        (TierActions(demote_share=0, shed_tier=None), "no action configured"),
    ],
)
def test_describe_active(actions: TierActions, words: str) -> None:
    assert describe_active(actions.to_dict()) == words


def test_shedding_and_lending_in_force_are_told_with_their_record(tmp_path: Path) -> None:
    """A utilization shed and a lend switched on by the tier step are explained with their
    numbers (the wait trigger quiet); once shedding is lifted it says so."""
    group = group_with(TierActionPolicy(trigger="wait", for_ms=0, recover_after_ms=0))
    busy = {
        "critical": TierPending(0, 0, (("ewr-1", 84.0),)),
        "normal": TierPending(0, 0, (("ewr-1", 20.0),)),
        "background": TierPending(40, 0, (("ewr-1", 6.0),)),
    }  # in use: (84 + 20 + 6) / 120 = 0.92; normal lends 30 - 20 - 3 = 7 to critical, which
    # wants 84 + 9 (headroom): it takes the other 2 from normal by preemption
    clock = [T0]
    with DecisionLog(tmp_path, clock=lambda: clock[0]) as log:
        result = tier_step(group, TierState(), busy, 0)
        for decision in result.decisions:
            log.record(decision.kind, pop="ewr", group="api", **result.record_fields(decision))
    assert [d.kind for d in result.decisions] == ["tier_shed", "tier_lend", "tier_preempt"]
    lines = explain_tiers(list(iter_records(tmp_path)), "ewr", "api")
    assert lines[0] == "tier actions: no tier actions active (none switched on in the log)"
    assert lines[1].startswith("utilization shedding: in force since 16:00:00 (tier_shed, seq ")
    assert "utilization 0.92 (worst Envoy ewr-1) > 0.85" in lines[1]
    assert "shed background (background reject)" in lines[1]
    assert lines[2].startswith("lending: in force since 16:00:00 (tier_lend, seq ")
    assert "critical 0→7" in lines[2]  # background is shed: it borrows nothing
    assert lines[3].startswith("preemption: in force since 16:00:00 (tier_preempt, seq ")
    assert "slots taken critical 0→2 (own slots left: normal 28)" in lines[3]
    clock[0] = T0 + timedelta(seconds=20)
    quiet = {name: TierPending(0, 20_000, (("ewr-1", 0.0),)) for name in busy}
    with DecisionLog(tmp_path, clock=lambda: clock[0]) as log:
        after = tier_step(group, result.state, quiet, 20_000)
        for decision in after.decisions:
            log.record(decision.kind, pop="ewr", group="api", **after.record_fields(decision))
    lines = explain_tiers(list(iter_records(tmp_path)), "ewr", "api")
    assert lines[1].startswith("utilization shedding: off since 16:00:20")
