"""The etcd intent store against a real etcd: election, terms, fencing, watches, endpoints."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import pytest

from control_plane.intent.etcd_store import (
    Deposed,
    EtcdStore,
    IntentWrite,
    StoreUnavailable,
    parse_store_url,
)
from harness.etcd import EtcdServer, etcd_binary
from harness.eventually import eventually

pytestmark = pytest.mark.skipif(etcd_binary() is None, reason="etcd not installed")


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    server = EtcdServer().start()
    yield server
    server.cleanup()


@pytest.fixture
async def store(etcd: EtcdServer, request: pytest.FixtureRequest) -> AsyncIterator[EtcdStore]:
    host, port = etcd.endpoint.split(":")
    s = EtcdStore([(host, int(port))], prefix=f"/test/{request.node.name}/")
    yield s
    await s.close()


def test_store_url_parsing() -> None:
    assert parse_store_url("etcd://127.0.0.1:2379") == [("127.0.0.1", 2379)]
    assert parse_store_url("etcd://a:1,b:2/") == [("a", 1), ("b", 2)]
    for bad in ("http://a:1", "etcd://a", "etcd://a:0", "etcd://:5", "etcd://a:x",
                "etcd://" + ",".join(f"h:{i + 1}" for i in range(17))):
        with pytest.raises(ValueError):
            parse_store_url(bad)


async def test_one_leader_and_terms_grow(etcd: EtcdServer, store: EtcdStore) -> None:
    host, port = etcd.endpoint.split(":")
    other = EtcdStore([(host, int(port))], prefix=store.prefix)
    try:
        lease_a = await store.grant_lease(2)
        lease_b = await other.grant_lease(2)
        first = await store.campaign("a", lease_a)
        assert first is not None
        assert await other.campaign("b", lease_b) is None
        assert await other.leader() is None  # a leader key naming no registered replica
        await store.register("a", {"id": "a"}, lease_a)
        assert await other.leader() == ("a", first.term)
        await store.revoke_lease(lease_a)  # a resigns: the key goes with its lease
        second = await other.campaign("b", lease_b)
        assert second is not None and second.term > first.term
    finally:
        await other.close()


async def test_commit_is_fenced_by_term(etcd: EtcdServer, store: EtcdStore) -> None:
    host, port = etcd.endpoint.split(":")
    other = EtcdStore([(host, int(port))], prefix=store.prefix)
    try:
        lease_a = await store.grant_lease(1)
        await store.register("a", {"id": "a"}, lease_a)
        old = await store.campaign("a", lease_a)
        assert old is not None
        await store.commit(old, IntentWrite(put={"groups/ewr/shop": {"w": 1}}))
        # a's lease runs out (a was paused): b is elected, a's next write must be refused

        async def no_leader() -> bool:
            return await store.leader() is None

        await eventually(no_leader, 5, "a's lease runs out", interval=0.1)
        new = await other.campaign("b", await other.grant_lease(5))
        assert new is not None
        with pytest.raises(Deposed):
            await store.commit(old, IntentWrite(put={"groups/ewr/shop": {"w": 2}}))
        _, values = await other.load()
        assert values == {"groups/ewr/shop": {"w": 1}}
        await other.commit(new, IntentWrite(put={"groups/ewr/shop": {"w": 3}},
                                            delete=["tiers/ewr/shop"]))
        _, values = await store.load()
        assert values == {"groups/ewr/shop": {"w": 3}}
    finally:
        await other.close()


async def test_watch_sees_intent_and_records_in_order(store: EtcdStore) -> None:
    lead = await store.campaign("a", await store.grant_lease(5))
    assert lead is not None
    revision, _ = await store.load()
    seen = []

    async def follow() -> None:
        async for event in store.watch_intent(revision + 1):
            seen.append((event.key.split("/")[0], event.value))
            if len(seen) == 3:
                return

    # a watch from a past revision replays what came since, whenever etcd registers it
    task = asyncio.create_task(follow())
    await store.commit(lead, IntentWrite(put={"groups/sjc/shop": {"w": 5}}))
    await store.publish_records("a", [{"kind": "shift"}])
    await store.commit(lead, IntentWrite(delete=["groups/sjc/shop"]))
    await asyncio.wait_for(task, 5)
    assert seen == [("intent", {"w": 5}), ("decisions", {"kind": "shift"}), ("intent", None)]


async def test_unreachable_endpoint_is_reported_and_the_next_one_used(
    etcd: EtcdServer, store: EtcdStore
) -> None:
    from harness.envoy_process import free_port

    host, port = etcd.endpoint.split(":")
    s = EtcdStore([("127.0.0.1", free_port()), (host, int(port))], prefix=store.prefix,
                  timeout_s=1)
    try:
        with pytest.raises(StoreUnavailable):
            await s.leader()
        assert await s.leader() is None  # moved on to the live endpoint
    finally:
        await s.close()


async def test_a_cancelled_call_cancels_its_task_even_when_grpc_swallows_it(
    store: EtcdStore,
) -> None:
    """grpc.aio can swallow the cancellation of a task awaiting a call (the task awaits grpc's
    own task, which catches the CancelledError and ends the call): the store raises it again, or
    a loop stopped by cancellation (the leader election) would go on for ever and its stop wait
    for ever."""
    lease = await store.grant_lease(10)
    client = await store._connected()
    real = client.refresh_lease
    waiting = asyncio.Event()

    async def swallowing(lease_id: int) -> object:
        async def prepare() -> None:  # as grpc.aio's call preparation does on a cancellation
            with contextlib.suppress(asyncio.CancelledError):
                waiting.set()
                await asyncio.Event().wait()

        await asyncio.create_task(prepare())
        return await real(lease_id)

    client.refresh_lease = swallowing  # type: ignore[method-assign]
    refresh = asyncio.create_task(store.refresh_lease(lease))
    await waiting.wait()
    refresh.cancel()
    with pytest.raises(asyncio.CancelledError):
        await refresh
    client.refresh_lease = real  # type: ignore[method-assign]
    assert await store.refresh_lease(lease) > 0  # the connection was not dropped for it
