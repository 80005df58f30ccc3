"""Issue 23 with replicas on a real etcd: the leader's rollout is every replica's, and a new
leader goes on from it.

Two Ballast replicas in-process share the intent in etcd (no Envoys: a PoP without nodes needs
no evidence, so a wave passes once baked). A change rolls out; the follower serves what the
leader decided, PoP by PoP. The leader stops while the canary bakes; the follower takes over,
bakes the canary again from its election and carries the rollout to the end.
"""

from __future__ import annotations

import contextlib
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
async def replica(etcd: EtcdServer, tmp_path: Path, name: str, desired: Path
                  ) -> AsyncIterator[BallastService]:
    service = BallastService(ServiceConfig(
        desired_path=desired, state_dir=tmp_path / name, xds_address=f"127.0.0.1:{free_port()}",
        admin_address=None, probes=False, reload_poll_s=0.1, rollout_poll_ms=100,
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
