"""Issue 23 with replicas on a real etcd: the leader's rollout is every replica's, a new
leader goes on from it, the leader's gates hear the nodes of every replica, and only the leader
starts a rollout.

Two Ballast replicas in-process share the intent in etcd.

- No Envoys (each replica's gates read one made-up node per PoP applying what its PoP serves
  and healthy windows, `tests/support/rollout_inputs.py`, so a wave passes once baked): a
  change rolls out; the follower serves what the leader decided, PoP by PoP. The leader stops
  while the canary bakes; the follower takes over, bakes the canary again from its election
  and carries the rollout to the end.
- A real Envoy of the canary PoP connected to the follower only: its NACK rolls the leader's
  rollout back, the message in the record; while it has not ACKed (stopped), the wave waits
  for it, and the leader's status counts it, on the follower.
- Another writer's values under ``acks/`` (not JSON, an overflowing time, a registered replica
  that shares none or an unreadable one): every replica's mirror goes on, and the leader's
  gate waits for the replica it cannot read (fails closed) until it goes.
- A SIGHUP on a follower with another file: validated and left to the leader (no rollout, no
  PoP moves); once the follower is elected, it applies the file it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from control_plane.decide.rollout import Rollout
from control_plane.decisions.read import iter_records
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.translate.bootstrap import ads_bootstrap
from harness.envoy_process import EnvoyProcess, free_port
from harness.etcd import EtcdServer, etcd_binary
from harness.eventually import eventually
from harness.rollout_fleet import POPS, Ports, rollout_desired
from tests.support.rollout_inputs import with_made_up_inputs

pytestmark = [pytest.mark.etcd,
              pytest.mark.skipif(etcd_binary() is None or shutil.which("etcdctl") is None,
                                 reason="etcd and etcdctl needed")]
NODE = "ewr-edge-1"  # the canary PoP's Envoy, connected to the follower only


@pytest.fixture
def etcd() -> Iterator[EtcdServer]:
    server = EtcdServer().start()
    yield server
    server.cleanup()


@contextlib.asynccontextmanager
async def replica(etcd: EtcdServer, tmp_path: Path, name: str, desired: Path,
                  reload_poll_s: float = 0.1, *, admin: bool = False
                  ) -> AsyncIterator[BallastService]:
    service = BallastService(ServiceConfig(
        desired_path=desired, state_dir=tmp_path / name, xds_address=f"127.0.0.1:{free_port()}",
        admin_address="127.0.0.1:0" if admin else None, probes=False,
        reload_poll_s=reload_poll_s, rollout_poll_ms=100,
        store_url=f"etcd://{etcd.endpoint}", replica_id=name, leader_ttl_s=2))
    await service.start()
    try:
        yield service
    finally:
        if service.ready:
            await service.stop(0.1)


def _leading(service: BallastService) -> bool:
    return service.replication is not None and service.replication.term is not None


def _published(rollout: Rollout | None) -> tuple[Rollout | None, str | None]:
    """A rollout as its leader publishes it to the followers: its latest gate reading is
    published only when the verdict changes (`decide/rollout.py`), its text moves every look."""
    if rollout is None:
        return None, None
    return replace(rollout, gate=None), rollout.gate.verdict if rollout.gate else None


async def test_a_new_leader_carries_the_rollout_on(etcd: EtcdServer, tmp_path: Path) -> None:
    ports = Ports({"ewr": 10000, "sjc": 10001, "lax": 10002}, 8001, 8002, 0)
    desired = tmp_path / "desired.yaml"
    desired.write_text(rollout_desired(ports))
    async with replica(etcd, tmp_path, "a", desired) as a:
        with_made_up_inputs(a, POPS)
        await eventually(lambda: _leading(a), 10, "a leads")
        async with replica(etcd, tmp_path, "b", desired) as b:
            with_made_up_inputs(b, POPS)
            old = a.server.intent.desired.digest
            desired.write_text(rollout_desired(ports, marker="replicated", bake="4s"))
            await eventually(lambda: a.rollouts.rollout is not None
                             and a.rollouts.rollout.phase == "baking", 10, "a's canary")
            new = a.rollouts.rollout.to_version
            # the follower serves what the leader decided, PoP by PoP
            await eventually(lambda: _published(b.rollouts.rollout) == _published(
                a.rollouts.rollout), 10, "b follows a's rollout")
            assert b.server.intent.intent.versions() == {"ewr": new, "sjc": old, "lax": old}
            await a.stop(0.1)  # the leader goes away while the canary bakes
            await eventually(lambda: _leading(b), 10, "b leads")
            await eventually(lambda: b.rollouts.rollout is not None
                             and b.rollouts.rollout.phase == "passed", 30,
                             "b carries the rollout to the end")
            assert set(b.server.intent.intent.versions().values()) == {new}
            records = list(iter_records(tmp_path / "b"))
            elected = next(r["seq"] for r in records if r["kind"] == "leader_elected")
            waves = [r["detail"]["pops"] for r in records
                     if r["kind"] == "wave_started" and r["seq"] > elected]
            assert waves[-2:] == [["sjc"], ["lax"]], waves
            passed = [r for r in records if r["kind"] == "rollout_passed" and r["seq"] > elected]
            assert passed and passed[-1]["replica"] == "b", passed


async def test_a_peer_value_that_cannot_be_read_holds_the_wave_and_stops_no_mirror(
        etcd: EtcdServer, tmp_path: Path) -> None:
    def etcdctl(*args: str) -> None:
        subprocess.run(["etcdctl", f"--endpoints={etcd.endpoint}", *args], check=True,
                       capture_output=True, timeout=20, env={**os.environ, "ETCDCTL_API": "3"})

    # another writer's values, there before any replica reads them, and under no registration
    await asyncio.to_thread(etcdctl, "put", "/ballast/acks/junk", "not json")
    await asyncio.to_thread(etcdctl, "put", "/ballast/acks/rogue",
                            '{"pops": {}, "nacks": [{"at_ms": 1e999}]}')
    ports = Ports({"ewr": 10000, "sjc": 10001, "lax": 10002}, 8001, 8002, 0)
    desired = tmp_path / "desired.yaml"
    desired.write_text(rollout_desired(ports))
    async with replica(etcd, tmp_path, "a", desired) as a:
        with_made_up_inputs(a, POPS)  # the ghost's unreadable nodes still come from a's ACKs
        await eventually(lambda: _leading(a), 10, "a leads")
        async with replica(etcd, tmp_path, "b", desired) as b:
            await eventually(lambda: b.replication is not None
                             and b.replication.leader is not None, 10, "b knows its leader")
            # a live replica that shares nothing: its nodes cannot be told
            await asyncio.to_thread(etcdctl, "put", "/ballast/replicas/ghost", '{"id": "ghost"}')
            await eventually(lambda: "ghost" in a.replication.peer_acks(), 10,
                             "a sees the ghost registered")
            desired.write_text(rollout_desired(ports, marker="held", bake="2s"))

            def held(why: str) -> bool:
                rollout = a.rollouts.rollout
                if rollout is None or rollout.gate is None:
                    return False
                assert rollout.wave == 0, rollout
                return rollout.gate.verdict == "wait" and any(
                    f"the nodes on replica ghost: {why}" in reason for reason in rollout.gate.why)

            await eventually(lambda: held("registered, but shares no ACK state"), 20,
                             "the canary waits for the ghost's nodes")
            # b's mirror goes on through the bad values: it follows a's rollout
            await eventually(lambda: _published(b.rollouts.rollout) == _published(
                a.rollouts.rollout), 10, "b follows a's rollout")
            await asyncio.to_thread(etcdctl, "put", "/ballast/acks/ghost", '{"pops": 7}')
            await eventually(lambda: held("its shared value is unreadable"), 10,
                             "the canary waits: the ghost's value cannot be read")
            # the ghost goes: the rollout passes, on both replicas
            await asyncio.to_thread(etcdctl, "del", "--prefix", "/ballast/replicas/ghost")
            await eventually(lambda: a.rollouts.rollout.phase == "passed", 30,
                             "the rollout passes once the ghost is gone")
            new = a.rollouts.rollout.to_version
            await eventually(lambda: set(b.server.intent.intent.versions().values()) == {new},
                             10, "b serves the new version in every PoP")


def _free_ports() -> Ports:
    """Listener ports for the three PoPs (ascending: the desired state offsets them from
    ewr's) and origins nobody answers on (the subjects here are ACKs and NACKs)."""
    ewr, sjc, lax = sorted(free_port() for _ in range(3))
    return Ports({"ewr": ewr, "sjc": sjc, "lax": lax}, free_port(), free_port(), 0)


@contextlib.asynccontextmanager
async def canary_envoy(follower: BallastService) -> AsyncIterator[EnvoyProcess]:
    """A real Envoy of ewr (the canary PoP) streaming from `follower` only; continued (if it
    was stopped) and stopped at the end."""
    admin = free_port()
    envoy = EnvoyProcess(ads_bootstrap(node_id=NODE, pop="ewr", xds_port=follower.server.port,
                                       admin_port=admin), admin).start()
    try:
        await asyncio.to_thread(envoy.wait_ready, 20)
        yield envoy
    finally:
        if envoy.proc is not None and envoy.proc.poll() is None:
            os.kill(envoy.proc.pid, signal.SIGCONT)
        envoy.stop()


@contextlib.asynccontextmanager
async def leader_and_follower(etcd: EtcdServer, tmp_path: Path, desired: Path
                              ) -> AsyncIterator[tuple[BallastService, BallastService, int]]:
    """Replica a leading, replica b following, the canary's Envoy on b (its pid), and a
    counting it (applied) through what b shares in etcd."""
    async with replica(etcd, tmp_path, "a", desired) as a:
        await eventually(lambda: _leading(a), 10, "a leads")
        async with replica(etcd, tmp_path, "b", desired) as b, canary_envoy(b) as envoy:
            await eventually(lambda: a.server.acks.pop("ewr").applied == 1, 10,
                             "a counts b's Envoy of ewr")
            assert envoy.proc is not None
            yield a, b, envoy.proc.pid


async def test_a_nack_on_a_followers_node_rolls_the_leader_back(
        etcd: EtcdServer, tmp_path: Path) -> None:
    ports = _free_ports()
    desired = tmp_path / "desired.yaml"
    desired.write_text(rollout_desired(ports))
    async with leader_and_follower(etcd, tmp_path, desired) as (a, b, _):
        old = a.server.intent.intent.versions()
        assert a.server.nodes.pops() == set(), "the Envoy is on the follower only"
        desired.write_text(rollout_desired(ports, bad_filter=True))
        records = tmp_path / "a"
        rolled = await eventually(
            lambda: [r for r in iter_records(records) if r["kind"] == "rolled_back"], 30,
            "the leader rolls back")
        rule = rolled[-1]["rule"]
        assert rolled[-1]["replica"] == "a", rolled
        assert f"node {NODE} (Envoy " in rule and "on replica b) NACKed" in rule, rule
        assert "compressor" in rule.lower(), rule
        waves = [r["detail"]["pops"] for r in iter_records(records) if r["kind"] == "wave_started"]
        assert waves == [["ewr"]], waves
        await eventually(lambda: b.server.intent.intent.versions() == old, 10,
                         "the follower serves the last passed version again")


async def test_the_wave_waits_for_a_followers_node_to_ack(
        etcd: EtcdServer, tmp_path: Path) -> None:
    ports = _free_ports()
    desired = tmp_path / "desired.yaml"
    desired.write_text(rollout_desired(ports))
    async with leader_and_follower(etcd, tmp_path, desired) as (a, b, process):
        assert len(b.server.nodes) == 1 and len(a.server.nodes) == 0
        os.kill(process, signal.SIGSTOP)  # it cannot ACK what the wave sends it
        desired.write_text(rollout_desired(ports, marker="waits", bake="2s"))

        def waiting_past_the_bake() -> bool:
            rollout = a.rollouts.rollout
            if rollout is None or rollout.gate is None:
                return False
            assert rollout.wave == 0 and rollout.phase == "baking", rollout
            baked = a.rollouts.clock() - rollout.wave_started_ms >= 1000
            return baked and rollout.gate.verdict == "wait" and any(
                f"node {NODE} (on replica b) not ACKed yet" in why for why in rollout.gate.why)

        await eventually(waiting_past_the_bake, 20, "the canary waits for b's node")
        shown = a.status()["pop_versions"]["ewr"]
        assert shown["pending"] == 1 and shown["replicas"]["b"]["pending"] == 1, shown
        assert shown["replicas"]["a"] == {"version": shown["version"], "applied": 0,
                                          "pending": 0, "nacked": 0}, shown
        os.kill(process, signal.SIGCONT)
        await eventually(lambda: a.status()["pop_versions"]["ewr"]["applied"] == 1, 20,
                         "a counts b's node as applied")
        shown = a.status()["pop_versions"]["ewr"]
        assert shown["replicas"]["b"]["applied"] == 1, shown
        assert shown["version"] == a.rollouts.rollout.to_version, shown

        def acked() -> bool:
            gate = a.rollouts.rollout.gate
            return gate is not None and not any("not ACKed" in why for why in gate.why)

        await eventually(acked, 10, "the gate no longer waits for the node's ACK")
        rollout = a.rollouts.rollout
        assert rollout.wave == 0 and rollout.in_progress, rollout  # now: evidence (none on a)


async def test_a_sighup_on_a_follower_starts_no_rollout(etcd: EtcdServer, tmp_path: Path
                                                        ) -> None:
    ports = _free_ports()
    first = rollout_desired(ports)
    files = {name: tmp_path / f"{name}.yaml" for name in ("a", "b")}
    for path in files.values():
        path.write_text(first)
    async with replica(etcd, tmp_path, "a", files["a"]) as a:
        await eventually(lambda: _leading(a), 10, "a leads")
        # b's watcher polls once an hour: only the SIGHUP reads its file
        async with replica(etcd, tmp_path, "b", files["b"], reload_poll_s=3600) as b:
            old = a.server.intent.intent.versions()
            await eventually(lambda: b.replication is not None
                             and b.replication.leader is not None, 10, "b knows its leader")
            files["b"].write_text(rollout_desired(ports, marker="only-on-b"))
            loop = asyncio.get_running_loop()
            b.install_signal_handlers(asyncio.Event())
            try:
                os.kill(os.getpid(), signal.SIGHUP)
                deferred = await eventually(
                    lambda: [r for r in iter_records(tmp_path / "b")
                             if r["kind"] == "config_deferred"], 10, "b leaves it to a")
            finally:
                for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)
            assert "replica b does not lead (leader: a, term" in deferred[-1]["rule"], deferred
            assert b.rollouts.rollout is None and a.rollouts.rollout is None
            assert b.server.intent.intent.versions() == old == a.server.intent.intent.versions()
            assert not [r for r in iter_records(tmp_path / "b")
                        if r["kind"] in ("rollout_started", "wave_started")]
            # the leader applies the file it reads: b, elected, rolls its own file out
            await a.stop(0.1)
            await eventually(lambda: _leading(b), 10, "b leads")
            new = deferred[-1]["detail"]["digest"]
            await eventually(lambda: b.rollouts.rollout is not None
                             and b.rollouts.rollout.to_version == new, 10,
                             "b rolls out the file it reads")


async def test_a_file_edited_while_every_replica_was_down(etcd: EtcdServer, tmp_path: Path
                                                          ) -> None:
    """Issue 37. v2 bakes in the canary; the only replica stops; its file is edited (v3). It
    starts alone, is elected, and applies the file it reads: v3 supersedes v2 (the canary on
    v3, the others on v1), recorded as made while Ballast was down. A replica that starts as a
    follower with yet another file leaves it to the leader (`config_deferred`) and serves what
    the leader decided."""
    ports = _free_ports()
    files = {name: tmp_path / f"{name}.yaml" for name in ("a", "b")}
    files["a"].write_text(rollout_desired(ports))
    async with replica(etcd, tmp_path, "a", files["a"]) as a:
        await eventually(lambda: _leading(a), 10, "a leads")
        v1 = a.server.intent.desired.digest
        files["a"].write_text(rollout_desired(ports, marker="v2", bake="60s"))
        await eventually(lambda: a.rollouts.rollout is not None
                         and a.rollouts.rollout.phase == "baking", 10, "v2's canary")
        v2 = a.rollouts.rollout.to_version
    files["a"].write_text(rollout_desired(ports, marker="v3", bake="60s"))
    async with replica(etcd, tmp_path, "a", files["a"]) as a:
        await eventually(lambda: a.rollouts.rollout is not None
                         and a.rollouts.rollout.to_version not in (v1, v2), 10,
                         "a, elected, rolls the edited file out")
        rollout = a.rollouts.rollout
        v3 = rollout.to_version
        assert rollout.phase == "baking" and rollout.wave == 0 and rollout.from_version == v1
        assert a.server.intent.intent.versions() == {"ewr": v3, "sjc": v1, "lax": v1}
        records = list(iter_records(tmp_path / "a"))
        elected = max(r["seq"] for r in records if r["kind"] == "leader_elected")
        after = [r for r in records if r["seq"] > elected]
        assert [r["detail"]["superseded_by"] for r in after
                if r["kind"] == "rollout_superseded"] == [v3], after
        applied = [r for r in after if r["kind"] == "config_applied"]
        assert len(applied) == 1 and applied[0]["detail"]["digest"] == v3, applied
        files["b"].write_text(rollout_desired(ports, marker="only-on-b"))
        async with replica(etcd, tmp_path, "b", files["b"]) as b:
            deferred = await eventually(
                lambda: [r for r in iter_records(tmp_path / "b")
                         if r["kind"] == "config_deferred" and r.get("replica") == "b"], 10,
                "b leaves its file to a")
            assert "replica b does not lead (leader: a, term" in deferred[0]["rule"], deferred
            await eventually(lambda: _published(b.rollouts.rollout) == _published(
                a.rollouts.rollout), 10, "b follows a's rollout")
            assert b.server.intent.intent.versions() == {"ewr": v3, "sjc": v1, "lax": v1}
            assert a.rollouts.rollout.to_version == v3
