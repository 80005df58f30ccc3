"""The rollout driver publishing its decisions (`rollout/rollouts.py`) through the change
transaction on a real store and decision log: a decision whose swap failed after its records
were written is carried out on the next look without writing them again; a replica deposed
while it looked publishes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from envoy.data.accesslog.v3.accesslog_pb2 import HTTPAccessLogEntry

from control_plane.decide.gates import NodeAck, TierShed
from control_plane.decide.rollout import RolloutError
from control_plane.decisions.log import DecisionLog
from control_plane.decisions.read import iter_records
from control_plane.decisions.recorder import DecisionRecorder
from control_plane.desired import parse_desired
from control_plane.intent.change import SwapFailed
from control_plane.intent.etcd_store import Deposed
from control_plane.intent.owner import IntentOwner
from control_plane.intent.rollout_state import Version
from control_plane.intent.sqlite_store import StateStore
from control_plane.intent.store import IntentBatch
from control_plane.observe.access_log import AccessLogStore
from control_plane.rollout.rollouts import Rollouts
from control_plane.xds_port.server import intent_and_cache
from tests.support.rollout_inputs import Healthy, WithNodes

T0 = 1_800_000_000_000
BAKE_MS = 60_000
POPS = ("ewr", "sjc", "lax")

YAML = """\
pops:
  ewr: {{listen_address: 127.0.0.1, port_offset: 0}}
  sjc: {{listen_address: 127.0.0.1, port_offset: 1}}
  lax: {{listen_address: 127.0.0.1, port_offset: 2}}
origin_groups:
  shop:
    origins:
      primary: {{address: 127.0.0.1, port: 8001}}
      secondary: {{address: 127.0.0.1, port: {secondary}}}
    preference:
      ewr: [primary, secondary]
      sjc: [primary, secondary]
      lax: [primary, secondary]
rollout: {{canary: [ewr], waves: [50%, 100%], bake: 1m, gates: {{min_samples: 5}}}}
listeners:
  - name: edge
    port: 10000
    virtual_hosts:
      - {{name: shop, domains: ["*"], origin_group: shop}}
"""


def version(secondary: int) -> Version:
    data = YAML.format(secondary=secondary).encode()
    return Version(parse_desired(data, "desired.yaml"), data)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


class Driver:
    def __init__(self, tmp_path: Path) -> None:
        self.old, self.new = version(8002), version(9002)
        self.store = StateStore(tmp_path)
        self.log = DecisionLog(tmp_path)
        self.recorder = DecisionRecorder(self.log)
        self.owner, self.cache = intent_and_cache(self.old.desired, store=self.store,
                                                  recorder=self.recorder)
        owner: IntentOwner = self.owner
        self.clock = Clock()
        # every node flushes its stats a second after anything (the wave's own window starts
        # after the first flush after a look saw it applying the version: looks early in a bake)
        self.rollouts = Rollouts(owner, WithNodes(owner), Healthy(POPS),  # type: ignore[arg-type]
                                 self.recorder, self.old, clock=self.clock,
                                 stats_after=lambda node, pop, at, flush: at + 1001)
        self.path = tmp_path

    async def apply_new(self) -> None:
        """What a reload does: the new version's rollout started in one change."""
        async with self.rollouts.lock:
            async with self.owner.change() as change:
                begun = await self.rollouts.begin(change, self.new, immediate=False, by="test")
                change.record(begun.records)
            begun.done()

    def kinds(self) -> list[tuple[str, list[str]]]:
        return [(r["kind"], r["detail"]["pops"]) for r in iter_records(self.path)
                if r["kind"] in ("wave_started", "wave_passed", "rollout_passed")]

    def close(self) -> None:
        self.log.close()
        self.store.close()


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Driver]:
    made = Driver(tmp_path)
    yield made
    made.close()


async def test_a_step_whose_swap_failed_is_carried_out_without_its_records_again(
        driver: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    await driver.apply_new()
    assert driver.owner.intent.versions()["sjc"] == driver.old.digest
    commit = driver.cache.commit

    def broken(*args: object, **kwargs: object) -> frozenset[str]:
        raise RuntimeError("swap broke")

    driver.clock.now = T0 + 1000  # a look early in the bake sees the canary applying it
    await driver.rollouts.look()
    # the canary baked: its wave passes and sjc's starts, but the swap fails
    driver.clock.now = T0 + BAKE_MS + 1
    monkeypatch.setattr(driver.cache, "commit", broken)
    with pytest.raises(SwapFailed):
        await driver.rollouts.look()
    assert driver.kinds() == [("wave_started", ["ewr"]), ("wave_passed", ["ewr"]),
                              ("wave_started", ["sjc"])]  # written before the swap
    assert driver.owner.intent.versions()["sjc"] == driver.old.digest
    assert driver.rollouts.rollout is not None and driver.rollouts.rollout.wave == 0
    # the next look carries that decision out (its wave start's time) and writes nothing again
    monkeypatch.setattr(driver.cache, "commit", commit)
    driver.clock.now += 1000
    await driver.rollouts.look()
    assert driver.owner.intent.versions()["sjc"] == driver.new.digest
    rollout = driver.rollouts.rollout
    assert rollout is not None and rollout.wave == 1
    assert rollout.wave_started_ms == T0 + BAKE_MS + 1
    assert driver.kinds() == [("wave_started", ["ewr"]), ("wave_passed", ["ewr"]),
                              ("wave_started", ["sjc"])]
    # and the rollout goes on from there as usual
    driver.clock.now += 1000
    await driver.rollouts.look()
    driver.clock.now = T0 + 2 * BAKE_MS + 2
    await driver.rollouts.look()
    assert driver.kinds()[-2:] == [("wave_passed", ["sjc"]), ("wave_started", ["lax"])]


async def test_an_operator_action_retried_after_a_failed_swap_is_recorded_once(
        driver: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    await driver.apply_new()
    commit = driver.cache.commit

    def broken(*args: object, **kwargs: object) -> frozenset[str]:
        raise RuntimeError("swap broke")

    monkeypatch.setattr(driver.cache, "commit", broken)
    with pytest.raises(SwapFailed):
        await driver.rollouts.act("abort", "ops")
    monkeypatch.setattr(driver.cache, "commit", commit)
    driver.clock.now += 5000
    after = await driver.rollouts.act("abort", "ops")
    assert after.phase == "aborted"
    assert driver.owner.intent.versions()["ewr"] == driver.old.digest
    aborted = [r for r in iter_records(driver.path) if r["kind"] == "rollout_aborted"]
    assert len(aborted) == 1, aborted


async def test_an_operator_action_whose_swap_failed_is_carried_out_by_the_next_step(
        driver: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    """The log says the rollout was aborted: the next look makes it so (once)."""
    await driver.apply_new()
    commit = driver.cache.commit

    def broken(*args: object, **kwargs: object) -> frozenset[str]:
        raise RuntimeError("swap broke")

    monkeypatch.setattr(driver.cache, "commit", broken)
    with pytest.raises(SwapFailed):
        await driver.rollouts.act("abort", "ops")
    monkeypatch.setattr(driver.cache, "commit", commit)
    driver.clock.now = T0 + BAKE_MS + 1  # baked: without the abort, its wave would pass
    await driver.rollouts.look()
    assert driver.rollouts.rollout is not None and driver.rollouts.rollout.phase == "aborted"
    assert driver.owner.intent.versions()["ewr"] == driver.old.digest
    kinds = [r["kind"] for r in iter_records(driver.path)]
    assert kinds.count("rollout_aborted") == 1 and "wave_passed" not in kinds, kinds


async def test_a_replica_deposed_while_its_step_looked_records_and_swaps_nothing(
        driver: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    """It led when the step began; by the time the decision is published another replica leads,
    and the fenced write says so: no record, no swap, the new leader carries the rollout on."""
    await driver.apply_new()
    driver.clock.now = T0 + 1000  # a look early in the bake sees the canary applying it
    await driver.rollouts.look()

    async def fenced(batch: IntentBatch) -> None:
        raise Deposed("term 7 ended: replica r1 leads")

    monkeypatch.setattr(driver.store, "write", fenced)
    driver.clock.now = T0 + BAKE_MS + 1  # baked: its wave would pass and sjc's start
    with pytest.raises(RolloutError, match="no longer leads"):
        await driver.rollouts.look()
    assert driver.kinds() == [("wave_started", ["ewr"])]
    assert driver.owner.intent.versions()["sjc"] == driver.old.digest
    assert driver.rollouts.rollout is not None and driver.rollouts.rollout.wave == 0


def _entry(route: str, cluster: str = "") -> HTTPAccessLogEntry:
    entry = HTTPAccessLogEntry()
    entry.common_properties.route_name = route
    if cluster:
        entry.common_properties.upstream_cluster = cluster
        entry.common_properties.time_to_first_upstream_tx_byte.FromMilliseconds(2)
        entry.common_properties.duration.FromMilliseconds(5)
    return entry


async def test_the_gates_read_each_tiers_shed_rate_from_the_access_log(tmp_path: Path) -> None:
    """Issue 33: every PopWindow was built with no tier data, so the shed-rate gate never ran
    in the product. The driver's windows carry each tier's logged requests and sheds (a shed
    request's route names its group and tier), the wave's, the old PoPs' and the before."""
    store = AccessLogStore()
    driver = Driver(tmp_path)
    try:
        driver.rollouts._sheds = store.sheds  # what the service wires
        await driver.apply_new()
        for pop in POPS:
            store.ingest(pop, [_entry("checkout", "shop.critical")] * 8
                         + [_entry("prefetch", "shop.background")] * 6
                         + [_entry("prefetch@shed/shop/background")] * (4 if pop == "ewr" else 0),
                         T0 + 4800)  # after the canary's own window starts (T0 + 2001)
        driver.clock.now = T0 + 1000
        await driver.rollouts.look()  # the canary seen applying it
        rollout = driver.rollouts.rollout
        assert rollout is not None
        inputs = await driver.rollouts.inputs(rollout, T0 + 5000)
    finally:
        driver.close()
    (ewr,) = inputs.after
    assert dict(((g, t), shed) for g, t, shed in ewr.tiers) == {
        ("shop", "background"): TierShed(10, 4), ("shop", "critical"): TierShed(8, 0)}
    assert {w.pop: dict(((g, t), s) for g, t, s in w.tiers)[("shop", "background")]
            for w in inputs.peers} == {"sjc": TierShed(6, 0), "lax": TierShed(6, 0)}


async def test_a_waves_own_window_starts_after_its_nodes_first_flush_past_the_ack(
        tmp_path: Path) -> None:
    """Issue 33: 'wave 1 passed 1.5 s after it started on 5xx 0.0 % (0 of 25)': the first
    flush after a wave starts carries traffic served on the old version. Per node, the window
    starts after its first flush after a look saw it applying the version (the sink says
    where: `SinkStore.stats_after`); the PoP's is the latest of its nodes'; none while one
    has not applied it or flushed since."""
    driver = Driver(tmp_path)
    after: dict[str, int | None] = {"ewr-1": T0 + 1801, "ewr-2": None}
    asked: list[tuple[str, str, int, int]] = []

    def stats_after(node: str, pop: str, at: int, flush: int) -> int | None:
        asked.append((node, pop, at, flush))
        return after[node]

    driver.rollouts._stats_after = stats_after
    try:
        await driver.apply_new()
        rollout = driver.rollouts.rollout
        assert rollout is not None
        new, old = driver.new.digest, driver.old.digest
        one = (NodeAck("ewr", "ewr-1", new),)
        assert driver.rollouts.own_starts(rollout, one, T0 + 1000) == {"ewr": T0 + 1801}
        assert asked == [("ewr-1", "ewr", T0 + 1000, 5000)]  # seen at the look, 5 s flushes
        two = (*one, NodeAck("ewr", "ewr-2", new))
        assert driver.rollouts.own_starts(rollout, two, T0 + 1100) == {"ewr": None}
        after["ewr-2"] = T0 + 2101
        assert driver.rollouts.own_starts(rollout, two, T0 + 3000) == {"ewr": T0 + 2101}
        late = (NodeAck("ewr", "ewr-1", new), NodeAck("ewr", "ewr-3", old))
        assert driver.rollouts.own_starts(rollout, late, T0 + 3000) == {"ewr": None}
        driver.rollouts._stats_after = None  # Prometheus: a flush and a half after the ACK
        assert driver.rollouts.own_starts(rollout, one, T0 + 9000) == {"ewr": T0 + 1000 + 7500}
    finally:
        driver.close()


def test_a_tiers_requests_count_by_when_they_started_not_when_their_entry_came() -> None:
    """Envoy sends access-log entries in batches a second or more after the request: a burst
    served before a wave's ACK must not count in the wave's own window (it arrives after)."""
    store = AccessLogStore()
    early, late = _entry("checkout", "shop.critical"), _entry("checkout", "shop.critical")
    early.common_properties.start_time.FromMilliseconds(T0 + 1000)
    late.common_properties.start_time.FromMilliseconds(T0 + 2500)
    shed = _entry("prefetch@shed/shop/background")
    shed.common_properties.start_time.FromMilliseconds(T0 + 1500)
    store.ingest("ewr", [early, late, shed], T0 + 3000)  # one batch, after them all
    assert store.sheds(T0 + 4000, 2000) == {("ewr", "shop", "critical"): (1, 0)}
    assert store.sheds(T0 + 4000, 3500) == {("ewr", "shop", "background"): (1, 1),
                                            ("ewr", "shop", "critical"): (2, 0)}
