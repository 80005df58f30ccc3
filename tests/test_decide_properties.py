"""Property tests of the weight controller over random signal sequences (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane.decide import damping
from control_plane.decide.controller import ControllerState, StepResult, home_weights, step
from control_plane.decide.damping import Flap
from control_plane.decide.evidence import judge, no_evidence
from control_plane.decide.health import breach_reasons, is_healthy_window
from control_plane.decide.signals import OriginSignals
from control_plane.desired.model import FailoverPolicy

POLICY = FailoverPolicy()
TICK = 20_000
MODES = ("health_proportional", "linear", "exponential")
NAMES = ("primary", "secondary", "tertiary")

# (requests, 5xx, connect failures, p50, p95)
SHAPES: dict[str, tuple[int, int, int, float | None, float | None]] = {
    "healthy": (1000, 0, 0, 40.0, 120.0),
    "slow_p50": (1000, 0, 0, 300.0, 600.0),  # not breaching, but not healthy enough to return
    "borderline": (1000, 21, 0, 200.0, 700.0),  # 2.1 % 5xx: over the line, not surely
    "slow_p95": (1000, 0, 0, 200.0, 900.0),
    "bad": (1000, 79, 0, 200.0, 1200.0),
    # far past dead (10 % 5xx scores 0), where scores used to saturate: 60 % must still beat
    # 95 % by more than the compare margin
    "failing": (1000, 600, 0, 200.0, 1200.0),
    "failing_worse": (1000, 950, 0, 200.0, 1200.0),
    "dead": (100, 0, 900, None, None),
    "idle": (0, 0, 0, None, None),
}
Window = dict[str, tuple[str, int]] | None  # origin -> (shape, age of newest sample in ms)

shape = st.sampled_from(sorted(SHAPES))
age = st.one_of(st.integers(0, POLICY.stale_after_ms), st.integers(POLICY.stale_after_ms + 1,
                                                                    200_000))


def window(names: tuple[str, ...]) -> st.SearchStrategy[Window]:
    fresh = st.fixed_dictionaries({n: st.tuples(shape, st.integers(0, 30_000)) for n in names})
    odd = st.fixed_dictionaries({n: st.tuples(shape, age) for n in names})
    return st.one_of(fresh, fresh, fresh, odd, st.none())


@st.composite
def scenario(draw: st.DrawFn) -> tuple[FailoverPolicy, tuple[str, ...], list[Window], list[int]]:
    policy = replace(POLICY, mode=draw(st.sampled_from(MODES)))
    names = NAMES[: draw(st.integers(2, 3))]
    windows = draw(st.lists(window(names), min_size=1, max_size=40))
    jitters = draw(st.lists(st.integers(-policy.jitter, policy.jitter), min_size=len(windows),
                            max_size=len(windows)))
    return policy, names, windows, jitters


def signals_of(w: Window, now: int) -> dict[str, OriginSignals] | None:
    if w is None:
        return None
    return {
        name: OriginSignals(*SHAPES[kind][:3], *SHAPES[kind][3:], 0.0, 0, None, now - age_ms)
        for name, (kind, age_ms) in w.items()
    }


def simulate(
    policy: FailoverPolicy, names: tuple[str, ...], windows: list[Window], jitters: list[int]
) -> list[tuple[dict[str, OriginSignals] | None, StepResult]]:
    weights = home_weights(names, policy.min_warm_pool)
    state = ControllerState()
    out = []
    for tick, (w, jitter) in enumerate(zip(windows, jitters, strict=True), start=1):
        signals = signals_of(w, tick * TICK)
        result = step(policy, names, weights, state, signals, tick * TICK, jitter)
        out.append((signals, result))
        weights, state = result.weights_after, result.state
    return out


def fresh(policy: FailoverPolicy, signals: dict[str, OriginSignals] | None, now: int) -> bool:
    return signals is not None and all(
        now - s.observed_at_ms <= policy.stale_after_ms for s in signals.values()
    )


@settings(max_examples=200, deadline=None)
@given(scenario())
def test_weights_stay_valid_and_steps_stay_capped(case: tuple) -> None:
    policy, names, windows, jitters = case
    for _, result in simulate(policy, names, windows, jitters):
        after, before = result.weights_after, result.weights_before
        assert set(after) == set(names)
        assert all(type(w) is int and w >= 0 for w in after.values())
        assert sum(after.values()) == 100
        assert all(abs(after[n] - before[n]) <= policy.max_step for n in names)
        assert all(after[n] >= policy.min_warm_pool for n in names)  # the warm pool holds
        assert after != {names[0]: 100} | {n: 0 for n in names[1:]}
        assert result.changed == (result.kind in ("weight_shift", "return"))


@settings(max_examples=200, deadline=None)
@given(scenario())
def test_stale_or_missing_inputs_hold(case: tuple) -> None:
    policy, names, windows, jitters = case
    state = ControllerState()
    for tick, (signals, result) in enumerate(simulate(policy, names, windows, jitters), 1):
        if not fresh(policy, signals, tick * TICK):
            assert result.kind == "hold"
            assert result.weights_after == result.weights_before
            assert result.state == state
            assert result.rule.startswith("fail static")
        state = result.state


@settings(max_examples=200, deadline=None)
@given(scenario())
def test_weight_leaves_only_after_consecutive_breaches(case: tuple) -> None:
    policy, names, windows, jitters = case
    history: dict[str, list[bool]] = {n: [] for n in names}  # breach per evaluated window
    for tick, (signals, result) in enumerate(simulate(policy, names, windows, jitters), 1):
        if not fresh(policy, signals, tick * TICK):
            continue
        assert signals is not None
        for n in names:  # an inconclusive window (too few samples) leaves the streak as it was
            if judge(signals[n], policy).verdict != "inconclusive":
                history[n].append(bool(breach_reasons(signals[n], policy)))
        if result.kind == "weight_shift":
            losers = [n for n in names if result.weights_after[n] < result.weights_before[n]]
            assert losers
            for n in losers:
                assert history[n][-policy.breach_windows:] == [True] * policy.breach_windows


@settings(max_examples=200, deadline=None)
@given(scenario())
def test_weight_returns_only_after_healthy_windows(case: tuple) -> None:
    policy, names, windows, jitters = case
    good: dict[str, list[bool]] = {n: [] for n in names}
    for tick, (signals, result) in enumerate(simulate(policy, names, windows, jitters), 1):
        if not fresh(policy, signals, tick * TICK):
            continue
        assert signals is not None
        for n in names:
            if judge(signals[n], policy).verdict != "inconclusive":
                good[n].append(is_healthy_window(signals[n], policy))
        gainers = [n for n in names if result.weights_after[n] > result.weights_before[n]]
        if result.kind == "return":
            need = policy.return_healthy_windows
            assert len(gainers) == 1
            assert good[gainers[0]][-need:] == [True] * need
            p50 = signals[gainers[0]].p50_ms
            assert p50 is not None and p50 < policy.return_p50_ms
        elif result.kind == "weight_shift":
            # weight only goes to origins that are not breaching, or that score better than
            # every origin losing weight by the compare margin
            losers = [n for n in names if result.weights_after[n] < result.weights_before[n]]
            best_loser = max(result.scores[n].composite for n in losers)
            assert all(not breach_reasons(signals[n], policy)
                       or result.scores[n].composite >= best_loser + policy.compare_margin - 1e-9
                       for n in gainers)
        else:
            assert not gainers


@settings(max_examples=200, deadline=None)
@given(
    mode=st.sampled_from(MODES),
    names=st.sampled_from([NAMES[:2], NAMES]),
    data=st.data(),
)
def test_return_is_slower_than_leave(mode: str, names: tuple[str, ...], data: st.DataObject
                                     ) -> None:
    policy = replace(POLICY, mode=mode)
    home = home_weights(names, policy.min_warm_pool)
    jitter = st.integers(-policy.jitter, policy.jitter)
    weights, state, tick = dict(home), ControllerState(), 0

    def advance(primary: str) -> StepResult:
        nonlocal weights, state, tick
        tick += 1
        w = {n: ("healthy" if n != names[0] else primary, 0) for n in names}
        result = step(policy, names, weights, state, signals_of(w, tick * TICK), tick * TICK,
                      data.draw(jitter))
        weights, state = result.weights_after, result.state
        return result

    leave = 0
    while advance("dead").kind != "hold":
        leave += 1
    low = weights[names[0]]
    assert low < home[names[0]]
    back = 0
    while weights != home:
        advance("healthy")
        back += 1
        assert back < 100
    assert back > leave


@settings(max_examples=200, deadline=None)
@given(
    mode=st.sampled_from(MODES),
    pattern=st.lists(st.sampled_from(["borderline", "slow_p95", "bad"]), min_size=1, max_size=15),
    jitters=st.lists(st.integers(-2, 2), min_size=30, max_size=30),
)
def test_alternating_borderline_signals_do_not_flap(
    mode: str, pattern: list[str], jitters: list[int]
) -> None:
    """A breach every other window never adds up to two consecutive windows: nothing moves."""
    policy = replace(POLICY, mode=mode)
    windows: list[Window] = []
    for kind in pattern:
        windows += [{"primary": (kind, 0), "secondary": ("healthy", 0)},
                    {"primary": ("healthy", 0), "secondary": ("healthy", 0)}]
    results = simulate(policy, NAMES[:2], windows, jitters[: len(windows)])
    assert {result.weights_after["primary"] for _, result in results} == {95}
    assert {result.kind for _, result in results} <= {"threshold_breach", "steady"}


@settings(max_examples=200, deadline=None)
@given(noise=st.lists(st.integers(30, 40), min_size=4, max_size=20))
def test_small_score_noise_inside_hysteresis_does_not_move_weights(noise: list[int]) -> None:
    """Once at its target, a sick origin whose score wobbles by less than 5 points stays put."""
    policy = replace(POLICY, mode="health_proportional")
    names = NAMES[:2]
    weights, state = {"primary": 70, "secondary": 30}, ControllerState({"primary": 5}, {})
    for tick, errors in enumerate(noise, start=1):  # 3.0..4.0 % 5xx: scores 0.70..0.60
        sig = {"primary": OriginSignals(1000, errors, 0, 100.0, 200.0, 0.0, 0, None, tick * TICK),
               "secondary": OriginSignals(1000, 0, 0, 40.0, 100.0, 0.0, 0, None, tick * TICK)}
        result = step(policy, names, weights, state, sig, tick * TICK, 0)
        target = round((1 - errors / 1000 / 0.02 / 5) * 100)
        if weights["primary"] - target < policy.hysteresis:
            assert result.weights_after == weights
        weights, state = result.weights_after, result.state


@settings(max_examples=200, deadline=None)
@given(scenario(), st.integers(1, 50))
def test_streaks_stop_at_their_thresholds_without_changing_a_decision(
    case: tuple, extra: int
) -> None:
    """Streaks count to breach_windows + 1 and return_healthy_windows, then stay (a steady or a
    sick pair changes no state). Any longer count at a tick — what an uncapped counter would
    hold — decides the same weights, kind and reason."""
    policy, names, windows, jitters = case
    weights = home_weights(names, policy.min_warm_pool)
    state = ControllerState()
    for tick, (w, jitter) in enumerate(zip(windows, jitters, strict=True), start=1):
        signals = signals_of(w, tick * TICK)
        result = step(policy, names, weights, state, signals, tick * TICK, jitter)
        assert all(c <= policy.breach_windows + 1 for c in result.state.unhealthy_windows.values())
        assert all(c <= policy.return_healthy_windows
                   for c in result.state.healthy_windows.values())
        longer = ControllerState(
            unhealthy_windows={n: c + extra if c > policy.breach_windows else c
                               for n, c in state.unhealthy_windows.items()},
            healthy_windows={n: c + extra if c >= policy.return_healthy_windows else c
                             for n, c in state.healthy_windows.items()},
        )
        uncapped = step(policy, names, weights, longer, signals, tick * TICK, jitter)
        assert (uncapped.weights_after, uncapped.kind, uncapped.reason) == (
            result.weights_after, result.kind, result.reason)
        weights, state = result.weights_after, result.state


@settings(max_examples=300, deadline=None)
@given(scenario())
def test_a_sick_origin_with_a_better_alternative_loses_weight(case: tuple) -> None:
    """Compare, don't only threshold: the worst sick origin that is above its mode's target
    (by the hysteresis, so above its warm pool) and has another origin breaching nothing or
    scoring better by the margin, loses weight, whether or not that origin breaches too. A
    window with no conclusive evidence of any origin is a hold of its own (`no_evidence`), not
    a judgement of the sick origin: the streaks that made it sick are older than the window."""
    policy, names, windows, jitters = case
    for tick, (signals, result) in enumerate(simulate(policy, names, windows, jitters), 1):
        if not fresh(policy, signals, tick * TICK):
            continue
        assert signals is not None
        if no_evidence({n: judge(signals[n], policy) for n in names}):
            assert (result.kind, result.reason) == ("hold", "no_evidence"), result.rule
            continue
        before, scores = result.weights_before, result.scores
        sick = [n for n in names if result.state.unhealthy(n) >= policy.breach_windows]
        movable = [n for n in sick
                   if before[n] - _target(policy, before[n], scores[n].composite)
                   >= max(1, policy.hysteresis)]
        with_better = [
            n for n in movable
            if any(not breach_reasons(signals[o], policy)
                   or scores[o].composite >= scores[n].composite + policy.compare_margin - 1e-9
                   for o in names if o != n)
        ]
        if not with_better:
            continue
        worst = min(with_better, key=lambda n: scores[n].composite)
        assert result.kind == "weight_shift", result.rule
        assert result.weights_after[worst] < before[worst], result.rule
        assert "nowhere better" not in result.rule


def _target(policy: FailoverPolicy, weight: int, score: float) -> int:
    """The mode's leave target, as documented in `decide/controller.py` rule 3."""
    raw = {"health_proportional": round(score * 100), "linear": weight - policy.shift_step,
           "exponential": weight // 2}[policy.mode]
    return max(policy.min_warm_pool, min(weight, raw))


def test_every_origin_breaching_still_moves_to_the_better_one() -> None:
    """docs/scenarios/restart.md: the primary at 43.6 % 5xx was held at 41 % because the
    secondary showed 3.0 % 5xx. Now weight leaves for the secondary, whose score is higher."""
    def origin(errors: int) -> OriginSignals:
        return OriginSignals(1000, errors, 0, 40.0, 120.0, 0.0, 0, None, 2 * TICK)

    state = ControllerState({"primary": 3, "secondary": 3}, {})
    result = step(POLICY, ("primary", "secondary"), {"primary": 41, "secondary": 59}, state,
                  {"primary": origin(436), "secondary": origin(30)}, 2 * TICK, 0)
    assert result.kind == "weight_shift"
    assert result.weights_after == {"primary": 31, "secondary": 69}
    assert "secondary breaches too (5xx 3.0% > 2%) but scores 0.70" in result.rule
    # within the margin: nowhere better, held
    even = step(POLICY, ("primary", "secondary"), {"primary": 41, "secondary": 59}, state,
                {"primary": origin(436), "secondary": origin(436)}, 2 * TICK, 0)
    assert even.kind == "hold" and "nowhere better" in even.rule


DAMPED = replace(POLICY, damping_half_life_ms=300_000)


@st.composite
def damped_scenario(draw: st.DrawFn) -> tuple[FailoverPolicy, tuple[str, ...], list[Window],
                                               list[int]]:
    """Flapping primaries: fresh windows only, alternating runs of breaching and healthy."""
    policy = replace(DAMPED, mode=draw(st.sampled_from(MODES)),
                     damping_half_life_ms=draw(st.sampled_from([120_000, 300_000, 900_000])))
    names = NAMES[:2]
    runs = draw(st.lists(st.tuples(st.sampled_from(["bad", "dead", "healthy", "slow_p50"]),
                                   st.integers(1, 8)), min_size=1, max_size=12))
    windows: list[Window] = [{names[0]: (kind, 0), names[1]: ("healthy", 0)}
                             for kind, count in runs for _ in range(count)]
    jitters = draw(st.lists(st.integers(-policy.jitter, policy.jitter), min_size=len(windows),
                            max_size=len(windows)))
    return policy, names, windows, jitters


@settings(max_examples=300, deadline=None)
@given(damped_scenario())
def test_damping_suppresses_returns_only_above_the_suppress_level(case: tuple) -> None:
    """A model of the penalty (an onset adds `damping_penalty`, it halves every half-life and
    is forgotten below `damping_reuse`): a return needs `damping_return_windows` healthy
    windows exactly while the penalty is at or above `damping_suppress`, and
    `return_healthy_windows` otherwise; the penalty never grows between onsets."""
    policy, names, windows, jitters = case
    penalty = {n: (0.0, 0) for n in names}  # (value at, time)
    streak = {n: 0 for n in names}
    healthy: dict[str, list[bool]] = {n: [] for n in names}
    previous: dict[str, float] = {}
    for tick, (signals, result) in enumerate(simulate(policy, names, windows, jitters), 1):
        now = tick * TICK
        assert signals is not None
        model: dict[str, float] = {}
        for n in names:
            value, at = penalty[n]
            decayed = value * 0.5 ** ((now - at) / policy.damping_half_life_ms)
            streak[n] = streak[n] + 1 if breach_reasons(signals[n], policy) else 0
            if streak[n] == policy.breach_windows:
                penalty[n] = (min(decayed + policy.damping_penalty,
                                  policy.damping_suppress * 16.0), now)
                model[n] = penalty[n][0]
            elif decayed < policy.damping_reuse:
                penalty[n] = (0.0, now)
                model[n] = 0.0
            else:
                model[n] = decayed
                assert decayed <= previous.get(n, decayed), "decays between onsets"
            healthy[n].append(is_healthy_window(signals[n], policy))
            shown = result.damping.get(n, {"penalty": 0.0})["penalty"]
            assert abs(shown - round(model[n], 1)) < 0.11, (n, shown, model[n])
        previous = model
        need = {n: policy.damping_return_windows if model[n] >= policy.damping_suppress
                else policy.return_healthy_windows for n in names}
        if result.kind == "return":
            (to,) = [n for n in names if result.weights_after[n] > result.weights_before[n]]
            assert healthy[to][-need[to]:] == [True] * need[to], result.rule
        sick = [n for n in names if result.state.unhealthy(n) >= policy.breach_windows]
        home = home_weights(names, policy.min_warm_pool)
        below = [n for n in names if result.weights_before[n] < home[n]]
        if not sick and below:
            first = below[0]
            ready = healthy[first][-need[first]:] == [True] * need[first]
            assert (result.kind == "return") == ready, (model, result.rule)


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 40_000), st.integers(0, 10**9), st.integers(0, 10**9),
       st.integers(0, 10**9))
def test_a_penalty_always_decays(value: float, at: int, t1: int, t2: int) -> None:
    flap = Flap(value, at)
    early, late = sorted((at + t1, at + t2))
    assert flap.now(DAMPED, late) <= flap.now(DAMPED, early) <= value
    # four half-lives past the ceiling, nothing is suppressed any more
    top = damping.onset(Flap(damping.ceiling(DAMPED), at), DAMPED, at)
    assert not damping.suppressed(top, DAMPED, at + 4 * DAMPED.damping_half_life_ms + 1)


@settings(max_examples=300, deadline=None)
@given(
    mode=st.sampled_from(MODES),
    worse=st.integers(30, 1000),
    data=st.data(),
    p95=st.floats(0, 800),
)
def test_a_sick_primary_loses_weight_to_a_strictly_better_origin_at_any_rate(
    mode: str, worse: int, data: st.DataObject, p95: float,
) -> None:
    """Over the whole range of 5xx rates (scores no longer saturate at 0): the primary failing
    `worse` of 1000 and a secondary failing at least ten fewer (one point: half a threshold,
    the compare margin) with the same latency within its threshold, both for two windows:
    weight leaves the primary (95, far above its warm pool), whether or not the secondary
    breaches too."""
    policy = replace(POLICY, mode=mode)
    better = data.draw(st.integers(0, worse - 10))
    weights = home_weights(NAMES[:2], policy.min_warm_pool)
    state, result = ControllerState(), None
    for tick in (1, 2):
        signals = {
            "primary": OriginSignals(1000, worse, 0, 200.0, p95, 0.0, 0, None, tick * TICK),
            "secondary": OriginSignals(1000, better, 0, 200.0, p95, 0.0, 0, None, tick * TICK),
        }
        result = step(policy, NAMES[:2], weights, state, signals, tick * TICK, 0)
        weights, state = result.weights_after, result.state
    assert result is not None
    scores = result.scores
    assert (scores["secondary"].composite
            >= scores["primary"].composite + policy.compare_margin - 1e-9)
    assert result.kind == "weight_shift", result.rule
    assert result.weights_after["primary"] < 95, result.rule
    assert "nowhere better" not in result.rule
