"""The change transaction with a fault injected at each stage — the store write fails, the
decision log cannot be written (a full disk), the swap fails — for a reconcile tick, a hot
reload and a replica adopting its leader's intent: afterwards what is served and what is stored
agree (a restart would serve exactly what Envoys have now), and the records say what happened.

Real output cache, real SQLite store (real etcd for the replicas), real decision log; the faults
are injected where the disk or the translation would fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from control_plane.ads.snapshots import SnapshotCache
from control_plane.decide.controller import ControllerState
from control_plane.decide.signals import OriginSignals
from control_plane.decisions.log import DecisionLog
from control_plane.decisions.read import iter_records
from control_plane.decisions.recorder import DecisionRecorder
from control_plane.desired import parse_desired
from control_plane.desired.model import Desired
from control_plane.intent import change as change_module
from control_plane.intent import etcd_store
from control_plane.intent.carry_over import CarryOver, carry_over
from control_plane.intent.etcd_store import (
    Deposed,
    EtcdStore,
    Leadership,
    StoreUnavailable,
    UnavailableMidWrite,
)
from control_plane.intent.owner import IntentOwner
from control_plane.intent.pair_changes import PairChange
from control_plane.intent.replicated_store import ReplicatedStore
from control_plane.intent.running import RunningIntent
from control_plane.intent.served import translate_intent
from control_plane.intent.sqlite_store import StateStore
from control_plane.intent.store import IntentBatch, StoredIntent
from control_plane.observe.source import Signals
from control_plane.reconcile.reconcile import Reconciler
from control_plane.replicas.leadership import LeaderElection
from control_plane.replicas.replication import Replication
from control_plane.translate import render_json
from control_plane.translate.resources import Capabilities
from control_plane.translate.served import Served
from control_plane.xds_port.server import intent_and_cache
from harness.etcd import EtcdServer, etcd_binary
from harness.eventually import eventually
from harness.intent_changes import apply_pair_changes
from harness.models import example_desired
from tests.support.example_service import example_service
from tests.support.replica_loops import start_replica

T0 = 1_800_000_000_000
FAULTS = ["save", "record", "swap"]
CAPS = Capabilities()
IMMEDIATE = "rollout: {strategy: immediate}\n"  # a reload reaches every PoP at once


class EwrPrimaryFails:
    """ewr's primary answers 30% errors: a breach, then a shift every tick."""

    async def window(self, now_ms: int, window_ms: int) -> Signals:
        def origin(errors: int) -> OriginSignals:
            return OriginSignals(1000, errors, 0, 20.0, 60.0, 0.0, 0, 1.0, now_ms)

        return {("ewr", "shop"): {"primary": origin(300), "secondary": origin(0)},
                ("sjc", "shop"): {"primary": origin(0), "secondary": origin(0)}}


def full_disk(*args: Any, **kwargs: Any) -> Any:
    raise OSError(errno.ENOSPC, "No space left on device")


def broken_swap(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("translation of a late PoP broke")


def assert_served_is_stored(cache: SnapshotCache[Served], owner: IntentOwner,
                            store: StateStore | StoredIntent, desired: Desired) -> None:
    """What a restart would restore from the store, translated, is what is served now, and the
    owner's intent is what is served."""
    stored = store.load() if isinstance(store, StateStore) else store
    restored = IntentOwner(desired).carried(stored, where="test")
    assert stored.desired_digest in (None, desired.digest)
    for pop in desired.pop_names:
        served = render_json(cache.resources(pop, CAPS))
        assert served == render_json(translate_intent(owner.intent, pop, CAPS)), pop
        assert served == render_json(translate_intent(restored.intent, pop, CAPS)), pop


def inject(fault: str, monkeypatch: pytest.MonkeyPatch, store: StateStore | ReplicatedStore,
           log: DecisionLog, cache: SnapshotCache[Served]) -> None:
    target, name, fails = {"save": (store, "write", full_disk),
                           "record": (log, "write_drafts", full_disk),
                           "swap": (cache, "commit", broken_swap)}[fault]
    monkeypatch.setattr(target, name, fails)


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_tick_with_a_fault_leaves_served_and_stored_agreeing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    desired = example_desired()
    store = StateStore(tmp_path)
    log = DecisionLog(tmp_path)
    recorder = DecisionRecorder(log)
    owner, cache = intent_and_cache(desired, store=store, recorder=recorder)
    for pop in desired.pop_names:
        cache.resources(pop, CAPS)
    reconciler = Reconciler(owner, EwrPrimaryFails(), seed=7)
    await reconciler.tick(T0)  # the breach: streaks only
    home = owner.weights("ewr", "shop")
    with monkeypatch.context() as patched:
        inject(fault, patched, store, log, cache)
        if fault == "save":
            with pytest.raises(OSError):
                await reconciler.tick(T0 + 20_000)
        else:
            await reconciler.tick(T0 + 20_000)  # the shift
        assert_served_is_stored(cache, owner, store, desired)
    shifted = owner.weights("ewr", "shop") != home
    assert shifted == (fault == "record")  # only a full log lets the shift through
    kinds = [r["kind"] for r in iter_records(tmp_path)]
    if fault == "record":  # kept in memory, written once the log takes records again
        assert recorder.waiting > 0 and "weight_shift" not in kinds
        recorder.flush()
        late = [r for r in iter_records(tmp_path) if r["kind"] == "weight_shift"]
        assert late and "recorded_late" in late[0]["detail"]
    elif fault == "swap":
        errors = [r for r in iter_records(tmp_path) if r["kind"] == "reconcile_error"]
        assert [(r["pop"], r["detail"]["phase"]) for r in errors] == [("ewr", "push")]
    else:  # the save failed: nothing was recorded, the next tick decides again
        assert "weight_shift" not in kinds
    await reconciler.tick(T0 + 40_000)  # and the loop goes on from what is stored
    assert owner.weights("ewr", "shop") != home
    assert_served_is_stored(cache, owner, store, desired)
    log.close()
    store.close()


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_reload_with_a_fault_leaves_served_and_stored_agreeing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    async with example_service(tmp_path, reconcile_interval_ms=3_600_000) as (service, text):
        assert isinstance(service.store, StateStore)
        owner, cache, store = service.server.intent, service.server.cache, service.store
        for pop in owner.desired.pop_names:
            cache.resources(pop, CAPS)
        before = owner.desired
        # every PoP at once: the transaction is the subject, not a rollout's waves
        edited = text.replace("port_offset: 1}", "port_offset: 2}") + IMMEDIATE
        with monkeypatch.context() as patched:
            inject(fault, patched, store, service.decisions, cache)
            applied = await service.reload.apply(edited.encode())
            assert applied == (fault == "record")
            assert_served_is_stored(cache, owner, store, owner.desired)
            assert store.load().desired_digest == owner.desired.digest
        assert (owner.desired is before) == (fault != "record")
        kinds = [r["kind"] for r in iter_records(service.config.state_dir)]
        if fault == "record":
            assert service.recorder.waiting >= 1 and "config_applied" not in kinds[-1:]
            service.recorder.flush()
            (applied_record,) = [r for r in iter_records(service.config.state_dir)
                                 if r["kind"] == "config_applied" and r["detail"].get("diff")]
            assert "recorded_late" in applied_record["detail"]
        else:
            (rejected,) = [r for r in iter_records(service.config.state_dir)
                           if r["kind"] == "config_rejected"]
            reason = {"save": "cannot save the state", "swap": "cannot publish"}[fault]
            assert reason in rejected["detail"]["problems"][0]
        assert service.is_ready()  # the log took the kept records: nothing left to say


async def test_a_reload_whose_save_finds_the_lead_lost_is_left_to_the_leader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica that led when the reload checked, deposed before its fenced save: the file is
    valid, so it is deferred to the leader (recorded as such), not rejected; nothing changes."""
    async with example_service(tmp_path, reconcile_interval_ms=3_600_000) as (service, text):
        owner, before = service.server.intent, service.server.intent.desired

        async def fenced(batch: IntentBatch) -> None:
            raise Deposed("term 4 ended: replica r1 leads")

        monkeypatch.setattr(service.store, "write", fenced)
        edited = text.replace("port_offset: 1}", "port_offset: 2}") + IMMEDIATE
        assert await service.reload.apply(edited.encode()) is False
        assert owner.desired is before
        records = list(iter_records(service.config.state_dir))
        assert "config_rejected" not in [r["kind"] for r in records]
        (deferred,) = [r for r in records if r["kind"] == "config_deferred"]
        assert "term 4 ended" in deferred["detail"]["why"], deferred



async def test_a_step_during_a_reloads_translation_is_not_held_up_nor_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reload's output is built before the lock: a reconcile step landing meanwhile does
    not wait for it, and the reload, stated again over the intent running at its turn, keeps
    the step (its PoP re-built at the swap). Served and stored agree."""
    async with example_service(tmp_path, reconcile_interval_ms=3_600_000) as (service, text):
        assert isinstance(service.store, StateStore)
        owner, cache, store = service.server.intent, service.server.cache, service.store
        for pop in owner.desired.pop_names:
            cache.resources(pop, CAPS)
        building, release = threading.Event(), threading.Event()
        prepare = cache.prepare

        def slow_prepare(source: RunningIntent, pops: Any = None) -> Any:
            build = prepare(source, pops)
            if pops is not None:  # a step's own build goes through at once
                return build

            def held() -> Any:
                building.set()
                release.wait(30)
                return build()

            return held

        monkeypatch.setattr(cache, "prepare", slow_prepare)
        edited = text.replace("read_timeout: 4s", "read_timeout: 5s") + IMMEDIATE
        reload = asyncio.create_task(service.reload.apply(edited.encode()))
        assert await asyncio.to_thread(building.wait, 30)
        moved = {"primary": 70, "secondary": 30}
        assert await apply_pair_changes(
            owner, [PairChange(("ewr", "shop"), moved, ControllerState())])
        assert not reload.done() and owner.weights("ewr", "shop") == moved
        release.set()
        assert await reload
        assert owner.weights("ewr", "shop") == moved  # the step survived the reload's swap
        assert_served_is_stored(cache, owner, store, owner.desired)


async def test_a_reloads_carry_over_runs_off_the_loop_and_keeps_a_step_landing_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new desired state's carry-over walks every (PoP, group) pair: it runs where the
    change prepares, on a worker thread, so the loop goes on meanwhile. A step that lands while
    it runs is kept (the carry-over runs again over it). Served and stored agree, byte for
    byte what translating the intent running afterwards from scratch gives."""
    async with example_service(tmp_path, reconcile_interval_ms=3_600_000) as (service, text):
        assert isinstance(service.store, StateStore)
        owner, cache, store = service.server.intent, service.server.cache, service.store
        for pop in owner.desired.pop_names:
            cache.resources(pop, CAPS)
        threads: list[threading.Thread] = []
        carrying, release = threading.Event(), threading.Event()

        def held_carry_over(*args: Any, **kwargs: Any) -> CarryOver:
            threads.append(threading.current_thread())
            if len(threads) == 1:  # the first one waits for the step (not the loop's turn)
                carrying.set()
                release.wait(10)
            return carry_over(*args, **kwargs)

        monkeypatch.setattr(change_module, "carry_over", held_carry_over)
        edited = text.replace("read_timeout: 4s", "read_timeout: 5s") + IMMEDIATE
        reload = asyncio.create_task(service.reload.apply(edited.encode()))
        assert await asyncio.to_thread(carrying.wait, 30)
        moved = {"primary": 70, "secondary": 30}
        assert await apply_pair_changes(
            owner, [PairChange(("ewr", "shop"), moved, ControllerState())])
        assert not reload.done() and owner.weights("ewr", "shop") == moved
        release.set()
        assert await reload
        assert threading.main_thread() not in threads, threads  # never on the loop's thread
        assert len(threads) == 2  # stated once more, over the step
        assert owner.weights("ewr", "shop") == moved  # the step survived the reload's swap
        assert owner.desired.digest == parse_desired(edited.encode(), "edited").digest
        assert_served_is_stored(cache, owner, store, owner.desired)


async def test_steps_landing_during_every_carry_over_do_not_hold_a_reload_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step lands while each carry-over of a reload runs off the lock (a fleet whose ticks
    come faster than a large desired state's carry-over): after `RESTATE_TRIES` lays the
    reload lays once more under the owner's lock, where no step lands, and goes through, the
    last step kept. Served and stored agree."""
    async with example_service(tmp_path, reconcile_interval_ms=3_600_000) as (service, text):
        assert isinstance(service.store, StateStore)
        owner, cache, store = service.server.intent, service.server.cache, service.store
        for pop in owner.desired.pop_names:
            cache.resources(pop, CAPS)
        # the reconcile tick the service makes as it starts holds the owner's lock a moment: a
        # lay then would take it for the reload's own turn
        registry = service.metrics.registry
        await eventually(
            lambda: bool(registry.get_sample_value("ballast_reconcile_tick_seconds_count"))
            and not owner.changing.locked(), 10, "the service's first tick is done")
        loop = asyncio.get_running_loop()
        lays: list[bool] = []  # for each lay: whether it ran under the owner's lock
        steps: list[int] = []

        def busy_carry_over(*args: Any, **kwargs: Any) -> CarryOver:
            locked = owner.changing.locked()  # only the reload's own turn can hold it now
            lays.append(locked)
            if not locked and len(steps) < 20:  # a step lands while this lay runs
                steps.append(50 + len(steps))
                step = PairChange(("ewr", "shop"), {"primary": steps[-1],
                                                    "secondary": 100 - steps[-1]},
                                  ControllerState())
                landed = asyncio.run_coroutine_threadsafe(apply_pair_changes(owner, [step]), loop)
                assert landed.result(10)
            return carry_over(*args, **kwargs)

        monkeypatch.setattr(change_module, "carry_over", busy_carry_over)
        edited = text.replace("read_timeout: 4s", "read_timeout: 5s") + IMMEDIATE
        assert await service.reload.apply(edited.encode())
        assert lays == [False] * change_module.RESTATE_TRIES + [True], lays
        assert owner.weights("ewr", "shop") == {"primary": steps[-1], "secondary": 100 - steps[-1]}
        assert owner.desired.digest == parse_desired(edited.encode(), "edited").digest
        assert_served_is_stored(cache, owner, store, owner.desired)


@pytest.mark.etcd
@pytest.mark.skipif(etcd_binary() is None, reason="etcd not installed")
@pytest.mark.parametrize("fault", FAULTS)
async def test_an_adopt_with_a_fault_leaves_served_and_stored_agreeing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """A follower adopts what its leader saved in etcd through the same transaction. It saves
    and records nothing of it, so a store it cannot write or a full log does not hold it up; a
    swap that fails keeps what it served (its intent and its output agree), and the mirror
    tries again until what it serves is what etcd holds — with no further change in etcd."""
    desired = example_desired()
    log = DecisionLog(tmp_path)
    recorder = DecisionRecorder(log)
    owner, cache = intent_and_cache(desired, recorder=recorder)
    for pop in desired.pop_names:
        cache.resources(pop, CAPS)
    tried: list[str] = []
    commit = cache.commit
    async with etcd_leader() as leader:
        follower = Replication(
            leader.client(), "f", ttl_s=2, owner=lambda: owner, recorder=recorder, info={"id": "f"})
        owner.store = follower.store  # as the service wires a replica's owner
        try:
            running = await start_replica(follower)
            with monkeypatch.context() as patched:
                inject(fault, patched, follower.store, log, cache)
                if fault == "swap":
                    def broken(*args: Any, **kwargs: Any) -> Any:
                        tried.append("commit")
                        return broken_swap()

                    patched.setattr(cache, "commit", broken)
                moved = {"primary": 70, "secondary": 30}  # the leader's tick shifted ewr
                await leader.shared.write(IntentBatch(
                    groups=(("ewr", "shop", moved, ControllerState()),),
                    desired_digest=desired.digest))
                stored = await leader.shared.read()
                if fault == "swap":
                    await eventually(lambda: len(tried) >= 2, 10, "the adopt tried again")
                    assert owner.weights("ewr", "shop") != moved  # kept what it served: the
                    assert_served_is_stored(cache, owner, StoredIntent(), desired)  # home
                else:
                    await eventually(lambda: owner.weights("ewr", "shop") == moved, 10,
                                     "the follower adopts the leader's weights")
                    assert_served_is_stored(cache, owner, stored, desired)
            if fault == "swap":  # publishing works again: the retry lands, nothing new in etcd
                assert cache.commit == commit
                await eventually(lambda: owner.weights("ewr", "shop") == moved, 10,
                                 "the follower catches up")
                assert_served_is_stored(cache, owner, stored, desired)
        finally:
            await running.stop()
            await follower.etcd.close()
            log.close()


@pytest.mark.parametrize("undo", ["at once", "before the next save"])
async def test_an_etcd_write_that_landed_in_part_is_put_back_and_never_adopted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, undo: str
) -> None:
    """A leader's change split in several etcd transactions (one operation each here); etcd
    stops answering after the first of its values. What landed is put back: at once, or, while
    etcd still fails, before the next save — and then what is stored is what is served. A
    follower never adopts the part: the write is marked under way until its last transaction."""
    desired = example_desired()
    log = DecisionLog(tmp_path)
    follower_log = DecisionLog(tmp_path / "f")
    follower_owner, follower_cache = intent_and_cache(
        desired, recorder=DecisionRecorder(follower_log))
    monkeypatch.setattr(etcd_store, "MAX_TXN_OPS", 1)
    calls: list[int] = []
    # the write's transactions: the mark, ewr's pair, sjc's pair, the mark cleared; the
    # third fails, and with "before the next save" the undo's first too
    failing = {3} if undo == "at once" else {3, 4}
    moved = {"primary": 60, "secondary": 40}
    both = [PairChange((pop, "shop"), moved, ControllerState()) for pop in ("ewr", "sjc")]
    async with etcd_leader() as leader:
        owner, cache = intent_and_cache(desired, store=leader.shared,
                                        recorder=DecisionRecorder(log))
        follower = Replication(
            leader.client(), "f", ttl_s=2, owner=lambda: follower_owner,
            recorder=DecisionRecorder(follower_log), info={"id": "f"})
        follower_owner.store = follower.store
        for pop in desired.pop_names:
            cache.resources(pop, CAPS)
            follower_cache.resources(pop, CAPS)
        transaction = leader.store._transaction

        async def flaky(*args: Any) -> Any:
            calls.append(len(calls) + 1)
            if len(calls) in failing:
                raise StoreUnavailable(f"etcd did not answer call {len(calls)} (test)")
            return await transaction(*args)

        try:
            running = await start_replica(follower)
            await eventually(lambda: follower.leader is not None, 10, "f knows its leader")
            monkeypatch.setattr(leader.store, "_transaction", flaky)
            home = {pop: owner.weights(pop, "shop") for pop in ("ewr", "sjc")}
            with pytest.raises(UnavailableMidWrite):
                await apply_pair_changes(owner, both)
            assert {pop: owner.weights(pop, "shop") for pop in home} == home
            revision, values = await leader.store.load()
            if undo == "at once":
                assert_served_is_stored(cache, owner, await leader.shared.read(), desired)
                assert etcd_store.WRITING not in values
            else:  # the undo failed too: one pair's new weights are stored, marked under way
                assert values["groups/ewr/shop"]["weights"] == moved
                assert "groups/sjc/shop" not in values and etcd_store.WRITING in values
                await eventually(lambda: follower.followed >= revision, 10,
                                 "the follower has taken the part")
                assert follower_owner.weights("ewr", "shop") == home["ewr"]  # not adopted
            await apply_pair_changes(owner, both)  # etcd answers again: put back, then saved
            assert {pop: owner.weights(pop, "shop") for pop in home} == dict.fromkeys(home, moved)
            assert_served_is_stored(cache, owner, await leader.shared.read(), desired)
            await eventually(lambda: follower_owner.weights("sjc", "shop") == moved, 10,
                             "the follower adopts the whole write")
            assert_served_is_stored(follower_cache, follower_owner, await leader.shared.read(),
                                    desired)
        finally:
            await running.stop()
            await follower.etcd.close()
            log.close()
            follower_log.close()


@dataclass
class EtcdLeader:
    """A real etcd and replica "a" leading in it; `shared` is the leader's fenced store."""

    etcd: EtcdServer
    store: EtcdStore
    shared: ReplicatedStore

    def client(self) -> EtcdStore:
        """Another replica's connection to the same etcd."""
        host, port = self.etcd.endpoint.split(":")
        return EtcdStore([(host, int(port))], timeout_s=1)


@contextlib.asynccontextmanager
async def etcd_leader() -> AsyncIterator[EtcdLeader]:
    """An etcd started for the test with "a" elected in it (its election only: its tick is
    played by writing what it would save); all of it gone afterwards."""
    etcd = EtcdServer().start()
    host, port = etcd.endpoint.split(":")
    store = EtcdStore([(host, int(port))], timeout_s=1)
    election = LeaderElection(store, "a", 2, info={"id": "a"}, on_change=_nothing,
                              retry_s=0.2)
    leading = asyncio.create_task(election.run())
    try:
        await eventually(lambda: election.leading() is not None, 10, "a leads")
        yield EtcdLeader(etcd, store, ReplicatedStore(store, election.leading))
    finally:
        leading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await leading
        await election.resign()
        await store.close()
        etcd.cleanup()


async def _nothing(lead: Leadership | None, why: str) -> None:
    """The leader's election only: its tick is played by writing what it would save."""
