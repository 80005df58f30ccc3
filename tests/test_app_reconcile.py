"""The reconcile loop's shell: order of persist/log/push, runs of holds and steadiness logged at
their start and end, one fsync per tick, holds on bad input.

Real snapshot cache, real decision log and real SQLite store in a temporary folder; the metric
source is a scripted one (the sources themselves are tested against real Envoys elsewhere).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from control_plane.ads.snapshots import SnapshotCache
from control_plane.decide.signals import OriginSignals, TierPending
from control_plane.decisions.explain import explain
from control_plane.decisions.log import DecisionLog
from control_plane.decisions.read import iter_records
from control_plane.decisions.recorder import DecisionRecorder
from control_plane.desired.model import Desired, Mirror, TierActionPolicy, TierActions
from control_plane.intent.served import translate_intent
from control_plane.intent.sqlite_store import StateStore
from control_plane.intent.store import IntentBatch
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.observe.source import Signals, TierSignals
from control_plane.reconcile.reconcile import Reconciler
from control_plane.translate import render_json
from control_plane.translate import served as served_module
from control_plane.translate.resources import Capabilities, PopResources
from control_plane.xds_port.server import intent_and_cache
from harness.envoy_process import free_port
from harness.intent_changes import set_desired
from harness.models import example_desired, fleet_desired, shop_group
from tests.support.example_service import example_service

T0 = 1_800_000_000_000
# origins this fast drain every tier's queue depth within its queue_timeout (84 x 800 / 5 and
# 30 x 1500 / 5 slots x ms over ms exceed the depths 2,000 and 8,000), so no pending limit
# bounds a queue in time here (decide/tiers.py part 4; tested in test_decide_tiers.py)
FAST_MS = 5.0


def _recorder(state_dir: Path) -> DecisionRecorder:
    return DecisionRecorder(DecisionLog(state_dir))


def _signals(now: int, error_rate: float) -> Signals:
    def origin(errors: int) -> OriginSignals:
        return OriginSignals(
            requests=1000, errors_5xx=errors, connect_failures=0, p50_ms=FAST_MS, p95_ms=60.0,
            pending_active=0.0, queue_overflow=0, probe_success=1.0, observed_at_ms=now,
        )

    group = {"primary": origin(int(1000 * error_rate)), "secondary": origin(0)}
    return {("ewr", "shop"): group, ("sjc", "shop"): {k: origin(0) for k in group}}


class ScriptedSource:
    def __init__(self) -> None:
        self.error_rate = 0.0
        self.fail = False
        self.stale_by = 0

    async def window(self, now_ms: int, window_ms: int) -> Signals:
        if self.fail:
            raise ConnectionError("prometheus unreachable")
        return _signals(now_ms - self.stale_by, self.error_rate)


@pytest.fixture
def loop_parts(tmp_path: Path) -> tuple[Reconciler, ScriptedSource, SnapshotCache, StateStore]:
    store = StateStore(tmp_path)
    intent, cache = intent_and_cache(example_desired(), store=store, recorder=_recorder(tmp_path))
    source = ScriptedSource()
    reconciler = Reconciler(intent, source, seed=7)
    return reconciler, source, cache, store


async def test_sick_origin_is_left_gradually_and_state_is_saved_before_the_push(
    tmp_path: Path, loop_parts: tuple[Reconciler, ScriptedSource, SnapshotCache, StateStore]
) -> None:
    reconciler, source, cache, store = loop_parts
    pushed: list[frozenset[str]] = []
    saved_at_push: list[dict[str, int]] = []

    def on_push(pops: frozenset[str]) -> None:
        pushed.append(pops)
        saved_at_push.append(store.load().groups[("ewr", "shop")].weights)

    cache.add_listener(on_push)
    for pop in ("ewr", "sjc"):  # as if a node of each PoP were connected
        cache.resources(pop, Capabilities())
    sjc_home = reconciler.intent.weights("sjc", "shop")
    source.error_rate = 0.3
    for tick in range(6):
        await reconciler.tick(T0 + tick * 20_000)
    kinds = [r["kind"] for r in iter_records(tmp_path) if r["pop"] == "ewr"]
    assert kinds[:2] == ["threshold_breach", "weight_shift"], kinds
    assert reconciler.intent.weights("sjc", "shop") == sjc_home
    assert pushed and all(pops == frozenset({"ewr"}) for pops in pushed), "only ewr pushed"
    assert saved_at_push[-1] == reconciler.intent.weights("ewr", "shop"), "saved before pushed"
    assert 5 <= reconciler.intent.weights("ewr", "shop")["primary"] < 95 - 10


async def test_steady_is_logged_once_and_a_broken_source_holds(
    tmp_path: Path, loop_parts: tuple[Reconciler, ScriptedSource, SnapshotCache, StateStore]
) -> None:
    reconciler, source, _, _ = loop_parts
    for tick in range(4):
        await reconciler.tick(T0 + tick * 20_000)
    assert [r["kind"] for r in iter_records(tmp_path)] == []  # steady from the start: nothing
    source.fail = True
    await reconciler.tick(T0 + 100_000)
    await reconciler.tick(T0 + 120_000)
    source.fail = False
    await reconciler.tick(T0 + 140_000)
    await reconciler.tick(T0 + 160_000)
    ewr = [r for r in iter_records(tmp_path) if r["pop"] == "ewr"]
    assert [r["kind"] for r in ewr] == ["hold", "hold_ended", "steady"], ewr
    assert ewr[0]["rule"].startswith("fail static"), ewr
    ended = ewr[1]["detail"]
    assert (ended["reason"], ended["ticks"], ended["ended_by"]) == ("fail_static", 2, "steady")
    assert ended["last_ms"] - ended["started_ms"] == 20_000
    assert reconciler.intent.weights("ewr", "shop") == {"primary": 95, "secondary": 5}


async def test_stale_metrics_hold_weights_mid_shift(
    tmp_path: Path, loop_parts: tuple[Reconciler, ScriptedSource, SnapshotCache, StateStore]
) -> None:
    reconciler, source, _, _ = loop_parts
    source.error_rate = 0.3
    for tick in range(3):
        await reconciler.tick(T0 + tick * 20_000)
    moved = reconciler.intent.weights("ewr", "shop")
    assert moved["primary"] < 95
    source.stale_by = 60_000  # newest sample a minute old: fail static
    await reconciler.tick(T0 + 60_000)
    assert reconciler.intent.weights("ewr", "shop") == moved
    last = [r for r in iter_records(tmp_path) if r["pop"] == "ewr"][-1]
    assert last["kind"] == "hold" and "stale" in last["rule"], last


async def test_restored_states_continue_streaks(tmp_path: Path) -> None:
    source = ScriptedSource()
    source.error_rate = 0.3
    store = StateStore(tmp_path)
    intent, _ = intent_and_cache(example_desired(), store=store, recorder=_recorder(tmp_path))
    first = Reconciler(intent, source, seed=1)
    await first.tick(T0)  # one bad window: breach noted, no move yet
    assert intent.weights("ewr", "shop")["primary"] == 95
    fresh, _ = intent_and_cache(example_desired(), store=store, recorder=_recorder(tmp_path))
    await fresh.restore(store.load(), where=str(store.path))
    second = Reconciler(fresh, source, seed=1)
    await second.tick(T0 + 20_000)  # the second consecutive bad window: leave now
    assert fresh.weights("ewr", "shop")["primary"] < 95


class ScriptedTiers:
    """Critical-tier pending per PoP; sjc always quiet."""

    def __init__(self) -> None:
        self.ewr = 0.0
        self.fail = False

    async def tier_pending(self, now_ms: int, window_ms: int) -> TierSignals:
        if self.fail:
            raise ConnectionError("prometheus unreachable")
        return {
            ("ewr", "shop"): {"critical": TierPending(self.ewr, now_ms)},
            ("sjc", "shop"): {"critical": TierPending(0.0, now_ms)},
        }


async def test_tier_actions_go_on_and_off_saved_before_the_push(tmp_path: Path) -> None:
    pending_trigger = TierActionPolicy(trigger="pending", lending=False)
    store = StateStore(tmp_path)
    intent, cache = intent_and_cache(
        example_desired(replace(shop_group(), tier_actions=pending_trigger)), store=store,
        recorder=_recorder(tmp_path))
    tiers = ScriptedTiers()
    reconciler = Reconciler(intent, ScriptedSource(),
                            tier_source=tiers, seed=7)
    for pop in ("ewr", "sjc"):
        cache.resources(pop, Capabilities())
    saved_at_push: list[object] = []
    cache.add_listener(lambda pops: saved_at_push.append(
        (pops, store.load().tier_decisions.get("ewr/shop", {}).get("active"))))
    tiers.ewr = 25
    for tick in range(3):  # 0 s, 20 s, 40 s: on at 40 s (>= 30 s)
        await reconciler.tick(T0 + tick * 20_000)
    # background shed to its floor (5 % of 120: its whole share of 6), no queue beyond it
    shed = TierActions(shed_status=(("background", 503),), limits=(("background", 6),),
                       pending_limits=(("background", 6),))
    assert intent.tier_actions("ewr", "shop") == shed
    assert reconciler.intent.tier_actions("sjc", "shop") is None
    assert saved_at_push == [(frozenset({"ewr"}), True)], "saved before pushed; ewr only"
    (on,) = [r for r in iter_records(tmp_path) if r["kind"] == "tier_action"]
    assert (on["pop"], on["group"], on["detail"]["active"]) == ("ewr", "shop", True)
    assert on["inputs"]["readings"]["critical"]["pending_max"] == 25 and "for 40 s" in on["rule"]

    tiers.fail = True  # a failing source holds the actions
    await reconciler.tick(T0 + 60_000)
    assert intent.tier_actions("ewr", "shop") == shed
    tiers.fail, tiers.ewr = False, 2
    for tick in range(4, 8):  # quiet from 80 s; lifted at 140 s (60 s later)
        await reconciler.tick(T0 + tick * 20_000)
    assert reconciler.intent.tier_actions("ewr", "shop") is None
    assert [r["detail"]["active"] for r in iter_records(tmp_path)
            if r["kind"] == "tier_action"] == [True, False]
    assert store.load().tier_decisions == {}, "an idle state leaves the store"


class LendingTiers:
    """Every tier of ewr/shop read by one Envoy: idle critical and normal, busy background."""

    def __init__(self) -> None:
        self.critical = self.normal = 0.0

    async def tier_pending(self, now_ms: int, window_ms: int) -> TierSignals:
        return {("ewr", "shop"): {
            "critical": TierPending(0, now_ms, (("e1", self.critical),)),
            "normal": TierPending(0, now_ms, (("e1", self.normal),)),
            "background": TierPending(40, now_ms, (("e1", 6.0),)),
        }}


async def test_lending_and_reclaim_reach_the_cache_the_log_and_the_store(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    intent, _ = intent_and_cache(example_desired(), store=store, recorder=_recorder(tmp_path))
    tiers = LendingTiers()
    reconciler = Reconciler(intent, ScriptedSource(),
                            tier_source=tiers, seed=7)
    await reconciler.tick(T0)  # spare to lend: the growth waits `for` (30 s)
    assert reconciler.intent.tier_actions("ewr", "shop") is None
    await reconciler.tick(T0 + 30_000)
    actions = reconciler.intent.tier_actions("ewr", "shop")
    assert actions is not None and actions.limits == (("background", 47),)  # 6 + 40 + 1
    assert store.load().tier_decisions["ewr/shop"]["lent"] == {"background": 41}
    tiers.critical, tiers.normal = 75, 27  # the lenders' demand is back: reclaimed at once
    await reconciler.tick(T0 + 50_000)
    assert reconciler.intent.tier_actions("ewr", "shop") is None
    assert [r["detail"]["change"] for r in iter_records(tmp_path)
            if r["kind"] == "tier_lend"] == ["lend", "reclaim"]
    saved = store.load().tier_decisions["ewr/shop"]  # utilization 108/120: its hold started
    assert saved["lent"] == {} and saved["shed_since_ms"] == T0 + 50_000


async def test_a_tier_tick_runs_the_tier_step_alone_between_full_ticks(tmp_path: Path) -> None:
    """Failover every 20 s, tier ticks every 5 s (the default): a checkout surge seen at a tier
    tick is answered by preemption there, with no weight step, streak or quiet-run record."""
    intent, _ = intent_and_cache(example_desired(), recorder=_recorder(tmp_path))
    tiers = LendingTiers()
    tiers.normal = 30.0  # normal's pool busy: it lends nothing
    source = ScriptedSource()
    reconciler = Reconciler(intent, source, tier_source=tiers, seed=7)
    assert reconciler.tier_interval_ms(intent.intent.desired.group("shop")) == 5_000
    await reconciler.tick(T0, only_due=True)  # a full tick: every pair
    kinds_after_full = [r["kind"] for r in iter_records(tmp_path)]
    controller = dict(intent.intent.controllers)
    assert await reconciler.tick(T0 + 4_000, only_due=True) == []  # nothing due yet
    tiers.critical = 100.0  # checkout surges: critical wants 100 + 9 of its 84
    source.error_rate = 0.5  # a weight step would see this; a tier tick must not
    assert await reconciler.tick(T0 + 5_000, only_due=True) == []  # no weight step ran
    new = [r for r in iter_records(tmp_path)][len(kinds_after_full):]
    # normal's queue bound follows its 6 slots (6 x 1500 ms / 5 ms = 1,800 < its depth)
    assert [r["kind"] for r in new] == ["tier_preempt", "tier_queue"], [r["rule"] for r in new]
    assert new[0]["detail"]["took"] == {"critical": 24}  # normal down to its floor of 6
    actions = intent.tier_actions("ewr", "shop")
    assert actions is not None and dict(actions.limits) == {"critical": 108, "normal": 6}
    assert dict(intent.intent.controllers) == controller  # streaks held
    # the next full tick (20 s) runs everything again, the weight controller included
    await reconciler.tick(T0 + 20_000, only_due=True)
    assert any(r["kind"] == "threshold_breach" for r in iter_records(tmp_path))


async def test_service_restores_active_tier_actions_before_serving(tmp_path: Path) -> None:
    desired = tmp_path / "desired.yaml"
    desired.write_text(Path("examples/desired.yaml").read_text())
    state = tmp_path / "state"
    with StateStore(state) as store:
        active = {"active": True, "trigger_since_ms": T0, "clear_since_ms": None,
                  "active_since_ms": T0}
        await store.write(IntentBatch(records=(("tier", "ewr/shop", active),
                                               ("tier", "lhr/shop", active))))
    service = BallastService(ServiceConfig(
        desired_path=desired, state_dir=state, xds_address=f"127.0.0.1:{free_port()}",
        admin_address=None, probes=False,
    ))
    await service.start()
    try:
        shed_503 = TierActions(shed_status=(("background", 503),),
                               limits=(("background", 6),), pending_limits=(("background", 6),))
        assert service.server.intent.tier_actions("ewr", "shop") == shed_503
        assert service.server.intent.tier_actions("sjc", "shop") is None
        assert service.server.intent.tier_state(("ewr", "shop")).active
        assert service.status()["restored_tier_actions"] == 1
        (restored,) = [r for r in iter_records(state) if r["kind"] == "state_restored"]
        assert restored["detail"]["tier_actions_active"] == ["ewr/shop"]
        assert restored["detail"]["dropped"] == ["lhr/shop"]
    finally:
        await service.stop()


async def test_a_reload_during_the_metrics_read_skips_the_tick(
    tmp_path: Path, loop_parts: tuple[Reconciler, ScriptedSource, SnapshotCache, StateStore]
) -> None:
    reconciler, source, _, _ = loop_parts
    replaced = example_desired()

    class ReloadingSource(ScriptedSource):
        async def window(self, now_ms: int, window_ms: int) -> Signals:
            await set_desired(reconciler.intent, replaced)  # as if a reload landed meanwhile
            return await super().window(now_ms, window_ms)

    reconciler.source = ReloadingSource()
    assert await reconciler.tick(T0) == []
    assert reconciler.intent.desired is replaced
    reconciler.source = source
    assert len(await reconciler.tick(T0 + 20_000)) == 2


class NoMetrics:
    """A fleet whose Envoys have not reported yet."""

    async def window(self, now_ms: int, window_ms: int) -> Signals:
        return {}


async def test_a_fleet_without_metrics_logs_each_pair_once_with_one_fsync_per_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    desired = fleet_desired(pops=100, groups=50)
    pairs = 100 * 50
    log = DecisionLog(tmp_path)
    intent, _ = intent_and_cache(desired, store=StateStore(tmp_path),
                                 recorder=DecisionRecorder(log))
    reconciler = Reconciler(intent, NoMetrics())
    fsyncs: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    counts = []
    for tick in range(4):
        fsyncs.clear()
        await reconciler.tick(T0 + tick * 20_000)
        counts.append(sum(1 for _ in iter_records(tmp_path)))
        # the decision log's file: one fsync for the whole tick (SQLite syncs its own files)
        assert len(fsyncs) == (1 if tick == 0 else 0), (tick, fsyncs)
    assert counts == [pairs] * 4, counts  # O(pairs) once, not O(pairs x ticks)
    records = list(iter_records(tmp_path))
    assert {r["kind"] for r in records} == {"hold"}
    assert len({(r["pop"], r["group"]) for r in records}) == pairs


class Healthy:
    """Every origin of every pair healthy."""

    def __init__(self, desired: Desired) -> None:
        self.pairs = [(pop, group.name, group.preference[pop]) for pop in desired.pop_names
                      for group in desired.origin_groups]

    async def window(self, now_ms: int, window_ms: int) -> Signals:
        origin = OriginSignals(1000, 0, 0, FAST_MS, 60.0, 0.0, 0, 1.0, now_ms)
        return {(pop, group): dict.fromkeys(names, origin) for pop, group, names in self.pairs}


async def test_a_steady_fleet_with_metrics_saves_and_logs_nothing_once_its_streaks_are_full(
    tmp_path: Path,
) -> None:
    """Healthy windows count up to `return_healthy_windows` and stop: from then on a steady
    fleet's ticks write no store row, no record and push nothing (the tick costs what changed,
    nothing)."""
    desired = fleet_desired(pops=20, groups=10)
    rows: list[int] = []

    class CountingStore(StateStore):
        async def write(self, batch: IntentBatch) -> None:
            rows.append(len(batch.groups) + len(batch.records))
            await super().write(batch)

    intent, cache = intent_and_cache(desired, store=CountingStore(tmp_path),
                                     recorder=_recorder(tmp_path))
    for pop in desired.pop_names:
        cache.resources(pop, Capabilities())
    pushed: list[frozenset[str]] = []
    cache.add_listener(pushed.append)
    reconciler = Reconciler(intent, Healthy(desired))
    need = desired.origin_groups[0].failover.return_healthy_windows
    written, records = [], []
    for tick in range(need + 3):
        rows.clear()
        await reconciler.tick(T0 + tick * 20_000)
        written.append(sum(rows))
        records.append(sum(1 for _ in iter_records(tmp_path)))
    pairs = 20 * 10
    assert written == [pairs] * need + [0] * 3, written  # streaks counting, then nothing
    assert records == [0] * (need + 3), records  # steady from the first tick: nothing to log
    assert pushed == []


async def test_a_hold_run_is_closed_with_its_tick_count_when_it_changes_reason(
    tmp_path: Path, loop_parts: tuple[Reconciler, ScriptedSource, SnapshotCache, StateStore]
) -> None:
    reconciler, source, _, _ = loop_parts
    source.stale_by = 60_000  # fail static: stale
    for tick in range(5):
        await reconciler.tick(T0 + tick * 20_000)
    source.stale_by, source.error_rate = 0, 0.3  # fresh metrics, primary breaching
    await reconciler.tick(T0 + 100_000)
    ewr = [r for r in iter_records(tmp_path) if r["pop"] == "ewr"]
    assert [r["kind"] for r in ewr] == ["hold", "hold_ended", "threshold_breach"], ewr
    assert ewr[1]["detail"]["ticks"] == 5 and ewr[1]["detail"]["ended_by"] == "threshold_breach"
    assert ewr[1]["weights_after"] == ewr[0]["weights_after"]


async def test_cold_standby_ramps_step_by_step_and_the_ramp_survives_a_restart(
    tmp_path: Path
) -> None:
    desired = tmp_path / "desired.yaml"
    desired.write_text(Path("examples/desired.yaml").read_text())
    state = tmp_path / "state"
    source = ScriptedSource()
    source.error_rate = 0.5
    with StateStore(state) as store:
        intent, _ = intent_and_cache(example_desired(), store=store, recorder=_recorder(state))
        reconciler = Reconciler(intent, source, seed=7)
        seen, mirrors = [], []
        for tick in range(4):
            await reconciler.tick(T0 + tick * 20_000)
            seen.append(reconciler.intent.weights("ewr", "shop")["secondary"])
            mirrors.append(reconciler.intent.intent.mirror("ewr", "shop"))
        saved = store.load().ramps
    # breach, then 5 -> 10 -> 20 (one stage per interval), although the controller
    # would move 10-15 points a tick
    assert seen[:3] == [5, 10, 20] and 20 < seen[3] <= 40, seen
    ramps = [r for r in iter_records(state) if r["kind"].startswith("ramp_")]
    assert [r["kind"] for r in ramps] == ["ramp_start", "ramp_advance", "ramp_advance"], ramps
    assert "secondary is cold" in ramps[0]["rule"] and "allows 10 %" in ramps[0]["rule"]
    assert saved["ewr/shop"]["ramps"] == {"secondary": 3}  # the last stage: 40 %
    # the cache-warming mirror starts with the ramp, in ewr only
    assert mirrors == [None] + [Mirror(("secondary",), 5.0)] * 3
    assert reconciler.intent.intent.mirror("sjc", "shop") is None
    assert "mirroring 5 % of cacheable GET/HEAD requests" in ramps[0]["rule"]

    service = BallastService(ServiceConfig(
        desired_path=desired, state_dir=state, xds_address=f"127.0.0.1:{free_port()}",
        admin_address=None, probes=False,
    ))
    await service.start()
    try:
        ramp = service.server.intent.ramp_state(("ewr", "shop"))
        assert ramp.ramps == saved["ewr/shop"]["ramps"]
        assert service.server.intent.intent.mirror("ewr", "shop") == Mirror(("secondary",), 5.0)
        (restored,) = [r for r in iter_records(state) if r["kind"] == "state_restored"]
        assert "standby ramps ewr/shop (secondary)" in restored["rule"]
    finally:
        await service.stop()
    text = explain(list(iter_records(state)), "ewr", "shop")
    assert "standby ramp: secondary at stage" in text, text
    assert "ramp_advance: primary" in text, text


class Corrupt:
    """A reading every field of which raises when read: a source handing over garbage."""

    def __getattr__(self, name: str) -> object:
        raise RuntimeError(f"corrupt reading ({name})")


async def test_an_exception_in_one_pair_is_recorded_and_the_others_step_in_the_same_tick(
    tmp_path: Path, loop_parts: tuple[Reconciler, ScriptedSource, SnapshotCache, StateStore]
) -> None:
    reconciler, _, _, store = loop_parts

    class SjcCorrupt(ScriptedSource):
        async def window(self, now_ms: int, window_ms: int) -> Signals:
            signals = await super().window(now_ms, window_ms)
            return {**signals, ("sjc", "shop"): {"primary": Corrupt(), "secondary": Corrupt()}}

    source = SjcCorrupt()
    source.error_rate = 0.3  # ewr's primary breaches
    reconciler.source = source
    outcomes = [await reconciler.tick(T0 + tick * 20_000) for tick in range(2)]
    assert [[(o.pop, o.group) for o in tick] for tick in outcomes] == [[("ewr", "shop")]] * 2
    records = list(iter_records(tmp_path))
    assert [r["kind"] for r in records if r["pop"] == "ewr"][:2] == [
        "threshold_breach", "weight_shift"]
    errors = [r for r in records if r["kind"] == "reconcile_error"]
    assert [(r["pop"], r["group"], r["detail"]["phase"]) for r in errors] == [
        ("sjc", "shop", "decide")] * 2
    assert "failed while deciding" in errors[0]["rule"]
    assert "the other pairs went on" in errors[0]["rule"]
    assert reconciler.intent.weights("ewr", "shop")["primary"] < 95  # ewr stepped
    sjc_home = reconciler.intent.desired.group("shop").home_weights("sjc")
    assert reconciler.intent.weights("sjc", "shop") == sjc_home  # held
    saved = store.load().groups
    assert ("ewr", "shop") in saved and ("sjc", "shop") not in saved


async def test_a_push_that_raises_for_one_pair_leaves_the_others_pushed(
    tmp_path: Path, loop_parts: tuple[Reconciler, ScriptedSource, SnapshotCache, StateStore],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reconciler, _, cache, store = loop_parts

    class BothBreach(ScriptedSource):
        """Each PoP's preferred origin breaches (primary in ewr, secondary in sjc)."""

        async def window(self, now_ms: int, window_ms: int) -> Signals:
            ewr = _signals(now_ms, 0.3)[("ewr", "shop")]
            sjc = {"primary": ewr["secondary"], "secondary": ewr["primary"]}
            return {("ewr", "shop"): ewr, ("sjc", "shop"): sjc}

    reconciler.source = BothBreach()
    for pop in ("ewr", "sjc"):
        cache.resources(pop, Capabilities())
    real = served_module.translate_pop

    def translate_pop(desired: Desired, pop: str, *args: Any, **kwargs: Any) -> PopResources:
        if pop == "ewr":
            raise RuntimeError("translation broke")
        return real(desired, pop, *args, **kwargs)

    monkeypatch.setattr(served_module, "translate_pop", translate_pop)
    pushed: list[frozenset[str]] = []
    cache.add_listener(pushed.append)
    home = reconciler.intent.weights("ewr", "shop")
    await reconciler.tick(T0)  # both breach: streaks only, nothing to translate
    await reconciler.tick(T0 + 20_000)  # both shift: ewr's translation raises
    (error,) = [r for r in iter_records(tmp_path) if r["kind"] == "reconcile_error"]
    assert (error["pop"], error["detail"]["phase"]) == ("ewr", "push")
    assert "RuntimeError: translation broke" in error["rule"]
    assert pushed == [frozenset({"sjc"})]  # sjc in the same tick
    assert reconciler.intent.weights("sjc", "shop")["secondary"] < 95
    assert reconciler.intent.weights("ewr", "shop") == home  # held, and not saved as moved
    assert store.load().groups[("ewr", "shop")].weights == home
    shifts = [r["pop"] for r in iter_records(tmp_path) if r["kind"] == "weight_shift"]
    assert shifts == ["sjc"]


async def test_the_mirror_stops_when_the_ramp_completes(tmp_path: Path) -> None:
    intent, _ = intent_and_cache(example_desired(), store=StateStore(tmp_path),
                                 recorder=_recorder(tmp_path))
    source = ScriptedSource()
    source.error_rate = 0.5
    reconciler = Reconciler(intent, source, seed=7)
    tick = 0
    while intent.intent.mirror("ewr", "shop") is not None or tick < 2:
        await reconciler.tick(T0 + tick * 20_000)
        tick += 1
        assert tick < 12, "the ramp never completed"
    kinds = [r["kind"] for r in iter_records(tmp_path) if r["kind"].startswith("ramp_")]
    assert kinds[0] == "ramp_start" and kinds[-1] == "ramp_complete", kinds
    assert intent.weights("ewr", "shop")["secondary"] >= 40


async def test_the_mirror_stops_when_the_shift_reverses(tmp_path: Path) -> None:
    intent, _ = intent_and_cache(example_desired(), store=StateStore(tmp_path),
                                 recorder=_recorder(tmp_path))
    source = ScriptedSource()
    source.error_rate = 0.5
    reconciler = Reconciler(intent, source, seed=7)
    for tick in range(2):  # two bad windows: the shift and the ramp start
        await reconciler.tick(T0 + tick * 20_000)
    assert intent.intent.mirror("ewr", "shop") == Mirror(("secondary",), 5.0)
    source.error_rate = 0.0  # the primary recovers: after 3 healthy windows weight returns
    tick = 2
    while intent.intent.mirror("ewr", "shop") is not None:
        await reconciler.tick(T0 + tick * 20_000)
        tick += 1
        assert tick < 10, "the mirror never stopped"
    (end,) = [r for r in iter_records(tmp_path) if r["kind"] == "ramp_end"]
    assert "the shift reverses" in end["rule"] and "mirror stops" in end["rule"], end["rule"]
    assert intent.weights("ewr", "shop")["secondary"] < 10


@pytest.mark.parametrize("edit", ["tier policy", "PoP removed"])
async def test_a_reload_waits_for_a_tick_between_its_save_and_its_swap(
    tmp_path: Path, edit: str
) -> None:
    """A tick awaits its store write and its fsync; a reload arriving then waits until the tick
    has swapped in what it prepared, and then carries the tick's shift over (or drops it with
    its PoP): what runs only ever holds pairs of the desired state, and what is served is the
    running intent translated."""
    async with example_service(tmp_path, reconcile_interval_ms=3_600_000) as (service, text):
        reconciler, intent = service.reconciler, service.server.intent
        source = ScriptedSource()
        source.error_rate = 0.3
        reconciler.source = source
        await reconciler.tick(T0)  # the breach starts
        held, release = asyncio.Event(), asyncio.Event()
        sync = service.decisions.sync_in_thread

        ticking: set[asyncio.Task[object]] = set()

        async def slow_sync() -> None:  # the tick's sync only: the service syncs others too
            if asyncio.current_task() in ticking:
                held.set()
                await release.wait()
            await sync()

        service.decisions.sync_in_thread = slow_sync  # type: ignore[method-assign]
        tick = asyncio.create_task(reconciler.tick(T0 + 20_000))  # shifts ewr
        ticking.add(tick)
        await held.wait()
        edited = (text.replace("demote_share: 50%", "demote_share: 30%") if edit == "tier policy"
                  else text.replace("  ewr: {listen_address: 127.0.0.1, port_offset: 0}\n", "")
                  .replace("      ewr: [primary, secondary]\n", ""))
        assert edited != text
        reload = asyncio.create_task(service.reload.apply(edited.encode()))
        # everything a reload does before its swap takes well under a second here; then it
        # waits for the tick
        done, _ = await asyncio.wait({reload}, timeout=1.0)
        assert not done, "the reload swapped while the tick was between its save and swap"
        release.set()
        (shifted,) = [o for o in await tick if o.pop == "ewr"]
        assert await reload
        assert set(intent.intent.weights) <= set(intent.intent.pairs())
        if edit == "tier policy":
            moved = shifted.weights
            assert moved["primary"] < 95 and intent.weights("ewr", "shop") == moved
            assert intent.desired.group("shop").tier_actions.demote_share == 30
        else:
            assert intent.desired.pop_names == ("sjc",)
        for pop in intent.desired.pop_names:
            served = service.server.cache.resources(pop, Capabilities())
            assert render_json(served) == render_json(
                translate_intent(intent.intent, pop, Capabilities()))


async def test_a_poll_with_nothing_due_after_a_reload_does_not_read_the_intent_again(
    loop_parts: tuple[Reconciler, ScriptedSource, SnapshotCache, StateStore],
) -> None:
    """After `forget_missing` (a reload) a tick with no pair due sleeps until the next one is
    due: the polls before it return without walking every (PoP, group) pair again."""
    reconciler, _, _, _ = loop_parts
    await reconciler.tick(T0)  # every pair scheduled one interval later
    owner = reconciler.intent
    reads = 0

    class Counting:
        def __getattr__(self, name: str) -> Any:
            nonlocal reads
            reads += name == "intent"
            return getattr(owner, name)

    reconciler.intent = Counting()  # type: ignore[assignment]
    reconciler.forget_missing(owner.intent)
    assert await reconciler.tick(T0 + 1_000, only_due=True) == []
    assert reads == 1  # that poll walked the pairs: none is due
    for later in (2_000, 3_000, 4_000):
        assert await reconciler.tick(T0 + later, only_due=True) == []
    assert reads == 1  # the next polls knew nothing is due before the schedule's first
