"""Leader election on a real etcd: one leader, fast takeover, fail static when etcd goes away."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.decisions.log import DecisionLog
from control_plane.decisions.recorder import DecisionRecorder
from control_plane.intent.etcd_store import EtcdStore, Leadership
from control_plane.intent.owner import IntentOwner
from control_plane.replicas.leadership import LeaderElection
from control_plane.replicas.replication import Replication
from harness.etcd import EtcdServer, etcd_binary
from harness.eventually import eventually
from harness.models import example_desired
from tests.support.replica_loops import start_replica

pytestmark = pytest.mark.skipif(etcd_binary() is None, reason="etcd not installed")


@pytest.fixture
def etcd() -> Iterator[EtcdServer]:
    server = EtcdServer().start()
    yield server
    server.cleanup()


class Replica:
    def __init__(self, etcd: EtcdServer, name: str, ttl: int = 2) -> None:
        host, port = etcd.endpoint.split(":")
        self.store = EtcdStore([(host, int(port))], timeout_s=1)
        self.changes: list[tuple[int | None, str]] = []
        self.election = LeaderElection(
            self.store, name, ttl, info={"id": name}, on_change=self._changed, retry_s=0.2
        )
        self.task: asyncio.Task[None] | None = None

    async def _changed(self, lead: Leadership | None, why: str) -> None:
        self.changes.append((None if lead is None else lead.term, why))

    def start(self) -> Replica:
        self.task = asyncio.create_task(self.election.run())
        return self

    async def stop(self, *, resign: bool = True) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        if resign:
            await self.election.resign()
        await self.store.close()


async def test_exactly_one_leader_and_a_resignation_hands_over_at_once(etcd: EtcdServer) -> None:
    replicas = [Replica(etcd, name).start() for name in ("a", "b", "c")]
    try:
        await eventually(lambda: sum(r.election.leading() is not None for r in replicas) == 1, 10,
                         "one leader")
        await asyncio.sleep(1.0)  # followers refresh and watch; still one leader
        leaders = [r for r in replicas if r.election.leading() is not None]
        assert len(leaders) == 1
        first = leaders[0]
        term = first.election.leading().term  # type: ignore[union-attr]
        others = [r for r in replicas if r is not first]
        await first.stop()
        # the key went with the revoked lease: no TTL to wait for
        await eventually(lambda: any(r.election.leading() is not None for r in others), 1.5,
                         "another replica leads")
        new = next(r for r in others if r.election.leading() is not None)
        assert new.election.leading().term > term  # type: ignore[union-attr]
        replicas = others
    finally:
        for r in replicas:
            await r.stop()


async def test_a_killed_leader_is_replaced_within_the_ttl(etcd: EtcdServer) -> None:
    a = Replica(etcd, "a").start()
    await eventually(lambda: a.election.leading() is not None, 10, "a leads")
    b = Replica(etcd, "b").start()
    try:
        await asyncio.sleep(0.5)
        assert b.election.leading() is None
        await a.stop(resign=False)  # as kill -9: the lease simply stops being refreshed
        # TTL + watch delivery + etcd's lease expiry granularity
        await eventually(lambda: b.election.leading() is not None, 2 + 1.5, "b leads")
    finally:
        await b.stop()


async def test_etcd_unreachable_drops_leadership_and_it_comes_back(etcd: EtcdServer) -> None:
    a = Replica(etcd, "a").start()
    try:
        await eventually(lambda: a.election.leading() is not None, 10, "a leads")
        etcd.pause()
        await eventually(lambda: a.election.leading() is None, 2 + 1, "a gives the lead up")
        await eventually(lambda: not a.election.reachable, 5, "a finds etcd unreachable")
        assert a.changes[-1][0] is None
        etcd.resume()
        await eventually(lambda: a.election.leading() is not None, 15, "a leads again")
        assert a.election.reachable
    finally:
        etcd.resume()
        await a.stop()


async def test_a_followers_status_follows_the_membership_at_once(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    """A follower's status names the leader and every registered replica as soon as etcd has
    them, not a polling period later (here the period is a minute: only the watch can tell)."""
    leader = Replica(etcd, "a").start()
    await eventually(lambda: leader.election.leading() is not None)
    host, port = etcd.endpoint.split(":")
    owner = IntentOwner(example_desired())
    decisions = DecisionLog(tmp_path)
    follower = Replication(
        EtcdStore([(host, int(port))], timeout_s=1), "f", ttl_s=2, owner=lambda: owner,
        recorder=DecisionRecorder(decisions), info={"id": "f"},
        survey_s=60)
    running = await start_replica(follower)
    late: Replica | None = None
    try:
        await eventually(lambda: (follower.status()["leader"] or {}).get("replica") == "a")
        late = Replica(etcd, "late").start()
        await eventually(lambda: {r["id"] for r in follower.status()["replicas"]}
                    == {"a", "f", "late"})
        assert follower.status()["leading"] is False
    finally:
        await running.stop()
        await follower.etcd.close()
        decisions.close()
        await leader.stop()
        if late is not None:
            await late.stop()
