"""Issue 36, break 5: one bad value in etcd stops no replica, and a stray leader key leads nobody.

The probe that filed it, on a real etcd: `put /ballast/intent/kinds/zz/x 'not json'` made every
replica's start fail with "Expecting value: line 1 column 1 (char 0)" (no key named), the
running replica's watch logged a traceback every 0.5 s and followers stopped adopting; a
lease-less `put /ballast/leader evil` made `/status` show "evil" as leader.

Now, with bad values of several kinds there before any replica starts and more written while
they run: both replicas start, each bad value is quarantined (left out, recorded once with its
key, listed in `/status`), the mirror logs no traceback, and the follower still adopts the
leader's rollout. The control: the same values made good are adopted (nothing is left out for
being there). A lease-less leader key is never shown as a leader: the replicas delete it and
elect one of their own, with a new term, and the leader it displaced gives the lead up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from control_plane.decisions.read import iter_records
from control_plane.intent.etcd_store import EtcdStore, Leadership
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.replicas.leadership import LeaderElection
from harness.envoy_process import free_port
from harness.etcd import EtcdServer, etcd_binary
from harness.eventually import eventually
from harness.rollout_fleet import Ports, rollout_desired
from tests.test_rollout_replicas import _published

pytestmark = [pytest.mark.etcd,
              pytest.mark.skipif(etcd_binary() is None or shutil.which("etcdctl") is None,
                                 reason="etcd and etcdctl needed")]

BAD_AT_START = {
    "/ballast/intent/kinds/zz/x": "not json",
    "/ballast/intent/kinds/tier/ewr/gone": '{"active": "yes"}',
    "/ballast/intent/groups/ewr/gone": '{"weights": {"primary": 7}, "controller": {}}',
}
BAD_LATER = "/ballast/intent/kinds/ramp/sjc/gone"  # pairs no desired state has: no
# leader's tick rewrites them while the test looks


@pytest.fixture
def etcd() -> Iterator[EtcdServer]:
    server = EtcdServer().start()
    yield server
    server.cleanup()


def etcdctl(etcd: EtcdServer, *args: str) -> str:
    done = subprocess.run(["etcdctl", f"--endpoints={etcd.endpoint}", *args], check=True,
                          capture_output=True, timeout=20, text=True,
                          env={**os.environ, "ETCDCTL_API": "3"})
    return done.stdout


@contextlib.asynccontextmanager
async def replica(etcd: EtcdServer, tmp_path: Path, name: str,
                  desired: Path) -> AsyncIterator[BallastService]:
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


def leading(service: BallastService) -> bool:
    return service.replication is not None and service.replication.term is not None


def quarantined(service: BallastService) -> set[str]:
    assert service.replication is not None
    return set(service.replication.quarantined)


def records(tmp_path: Path, name: str, kind: str) -> list[dict[str, object]]:
    return [r for r in iter_records(tmp_path / name) if r["kind"] == kind]


async def test_bad_values_are_quarantined_and_stop_no_start_watch_or_follower(
    etcd: EtcdServer, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    for key, value in BAD_AT_START.items():
        await asyncio.to_thread(etcdctl, etcd, "put", key, value)
    ports = Ports({"ewr": 10000, "sjc": 10001, "lax": 10002}, 8001, 8002, 0)
    desired = tmp_path / "desired.yaml"
    desired.write_text(rollout_desired(ports))
    relative = {key.removeprefix("/ballast/intent/") for key in BAD_AT_START}
    async with replica(etcd, tmp_path, "a", desired) as a:  # starts: nothing refused
        await eventually(lambda: leading(a), 10, "a leads")
        assert quarantined(a) == relative
        async with replica(etcd, tmp_path, "b", desired) as b:
            await eventually(lambda: quarantined(b) == relative, 10, "b quarantines them too")
            why = b.replication.quarantined["kinds/zz/x"]  # type: ignore[union-attr]
            assert "not JSON" in why and "Expecting value" in why
            assert b.replication.status()["quarantined_count"] == 3  # type: ignore[union-attr]
            # recorded once each, naming the key, whatever the mirror's retries
            named = [r["detail"]["key"] for r in records(tmp_path, "b", "intent_quarantined")]
            assert sorted(named) == sorted(f"intent/{k}" for k in relative)

            # a bad value written while they run: quarantined, and no watch spins on it
            caplog.clear()
            await asyncio.to_thread(etcdctl, etcd, "put", BAD_LATER, "{")
            await eventually(lambda: "kinds/ramp/sjc/gone" in quarantined(b), 10,
                             "b quarantines the new value")
            await eventually(lambda: "kinds/ramp/sjc/gone" in quarantined(a), 10,
                             "a (leading) lists it too")
            await asyncio.sleep(2)  # four of the mirror's old 0.5 s retries
            texts = [r.getMessage() for r in caplog.records]
            assert not [r for r in caplog.records if r.exc_info], texts
            assert sum("ramp/sjc/gone left out" in t for t in texts) == 2, texts  # a and b

            # followers keep adopting: the leader's rollout reaches b
            old = a.server.intent.desired.digest
            desired.write_text(rollout_desired(ports, marker="adopted", bake="10m"))
            await eventually(lambda: a.rollouts.rollout is not None
                             and a.rollouts.rollout.phase == "baking", 10, "a's canary")
            await eventually(lambda: _published(b.rollouts.rollout) == _published(
                a.rollouts.rollout), 10, "b follows a's rollout")
            new = a.rollouts.rollout.to_version  # type: ignore[union-attr]
            assert b.server.intent.intent.versions() == {"ewr": new, "sjc": old, "lax": old}

            # the control: the values made good (deleted, rewritten) are nobody's quarantine
            await asyncio.to_thread(etcdctl, etcd, "del", "/ballast/intent/kinds/zz/x")
            await asyncio.to_thread(etcdctl, etcd, "del", BAD_LATER)
            await eventually(lambda: "kinds/zz/x" not in quarantined(b)
                             and "kinds/ramp/sjc/gone" not in quarantined(b), 10,
                             "b no longer lists what went")


class Candidate:
    def __init__(self, etcd: EtcdServer, name: str) -> None:
        host, port = etcd.endpoint.split(":")
        self.store = EtcdStore([(host, int(port))], timeout_s=1)
        self.changes: list[tuple[int | None, str]] = []
        self.election = LeaderElection(self.store, name, 2, info={"id": name},
                                       on_change=self._changed, retry_s=0.2)
        self.task = asyncio.create_task(self.election.run())

    async def _changed(self, lead: Leadership | None, why: str) -> None:
        self.changes.append((None if lead is None else lead.term, why))

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.election.resign()
        await self.store.close()


async def test_a_leader_key_on_no_lease_leads_nobody(etcd: EtcdServer) -> None:
    candidates = [Candidate(etcd, name) for name in ("a", "b")]
    try:
        def leaders() -> list[Candidate]:
            return [c for c in candidates if c.election.leading() is not None]

        await eventually(lambda: len(leaders()) == 1, 10, "one leader")
        [first] = leaders()
        term = first.election.leading().term  # type: ignore[union-attr]
        shown = [await first.store.leader()]
        assert shown == [(first.election.replica_id, term)]  # the control: a real one shows
        await asyncio.to_thread(etcdctl, etcd, "put", "/ballast/leader", "evil")
        for _ in range(40):  # what /status would show, sampled while they sort it out
            shown.append(await first.store.leader())
            await asyncio.sleep(0.05)
        assert all(s is None or s[0] in ("a", "b") for s in shown), shown
        await eventually(lambda: len(leaders()) == 1
                         and leaders()[0].election.leading().term > term,  # type: ignore
                         10, "a replica elected anew")
        new = leaders()[0]
        assert await new.store.leader() == (new.election.replica_id,
                                            new.election.leading().term)  # type: ignore
        assert "evil" not in etcdctl(etcd, "get", "/ballast/leader")
        assert any(why == "the leader key was taken" for _, why in first.changes), first.changes
    finally:
        for candidate in candidates:
            await candidate.stop()
