"""Issue 23 with replicas on a real etcd: the leader's rollout is every replica's, a new
leader goes on from it, and only the leader starts a rollout.

Two Ballast replicas in-process share the intent in etcd (no Envoys: a PoP without nodes needs
no evidence, so a wave passes once baked).

- A change rolls out; the follower serves what the leader decided, PoP by PoP. The leader
  stops while the canary bakes; the follower takes over, bakes the canary again from its
  election and carries the rollout to the end.
- A SIGHUP on a follower with another file: validated and left to the leader (no rollout, no
  PoP moves); once the follower is elected, it applies the file it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from control_plane.app.service import BallastService, ServiceConfig
from control_plane.decisions.read import iter_records
from harness.envoy_process import free_port
from harness.eventually import eventually
from harness.rollout_fleet import Ports, rollout_desired
from tests.support.etcd import EtcdServer, etcd_binary

pytestmark = [pytest.mark.etcd,
              pytest.mark.skipif(etcd_binary() is None, reason="etcd not installed")]


@pytest.fixture
def etcd() -> Iterator[EtcdServer]:
    server = EtcdServer().start()
    yield server
    server.cleanup()


@contextlib.asynccontextmanager
async def replica(etcd: EtcdServer, tmp_path: Path, name: str, desired: Path,
                  reload_poll_s: float = 0.1) -> AsyncIterator[BallastService]:
    service = BallastService(ServiceConfig(
        desired_path=desired, state_dir=tmp_path / name, xds_address=f"127.0.0.1:{free_port()}",
        admin_address=None, probes=False, reload_poll_s=reload_poll_s, rollout_poll_ms=100,
        store_url=f"etcd://{etcd.endpoint}", replica_id=name, leader_ttl_s=2))
    await service.start()
    try:
        yield service
    finally:
        if service.ready:
            await service.stop(0.1)


def _leading(service: BallastService) -> bool:
    return service.replication is not None and service.replication.term is not None


async def test_a_new_leader_carries_the_rollout_on(etcd: EtcdServer, tmp_path: Path) -> None:
    ports = Ports({"ewr": 10000, "sjc": 10001, "lax": 10002}, 8001, 8002, 0)
    desired = tmp_path / "desired.yaml"
    desired.write_text(rollout_desired(ports))
    async with replica(etcd, tmp_path, "a", desired) as a:
        await eventually(lambda: _leading(a), 10, "a leads")
        async with replica(etcd, tmp_path, "b", desired) as b:
            old = a.server.intent.desired.digest
            desired.write_text(rollout_desired(ports, marker="replicated", bake="4s"))
            await eventually(lambda: a.rollouts.rollout is not None
                             and a.rollouts.rollout.phase == "baking", 10, "a's canary")
            new = a.rollouts.rollout.to_version
            # the follower serves what the leader decided, PoP by PoP
            await eventually(lambda: b.rollouts.rollout == a.rollouts.rollout, 10,
                             "b follows a's rollout")
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


def _free_ports() -> Ports:
    """Listener ports for the three PoPs (ascending: the desired state offsets them from
    ewr's) and origins nobody answers on (the subjects here are ACKs and NACKs)."""
    ewr, sjc, lax = sorted(free_port() for _ in range(3))
    return Ports({"ewr": ewr, "sjc": sjc, "lax": lax}, free_port(), free_port(), 0)


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
