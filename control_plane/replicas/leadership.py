"""Leader election among Ballast replicas on an etcd lease (the shell around `intent.etcd_store`).

Every replica registers itself on its own lease and campaigns for the leader key with the same
lease. The elected replica keeps the lease alive every TTL/3; it considers itself leader only
while the last successful refresh is younger than the TTL (so a replica paused past its lease
stops acting as leader on its own, before etcd tells it), and every write it makes is fenced by
its term anyway. A follower waits on a watch of the leader key and campaigns as soon as the key
goes (the old leader's lease expired or was revoked), so a takeover takes at most the TTL plus
the watch's delivery. The leader watches the key too: when it is no longer its own (another
writer's `put` took it off the lease, or replaced it), it gives the lead up at once rather
than at its next fenced write. Any etcd error drops leadership (fail static: the replicas keep
serving the last intent) and the loop starts over after a short back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from control_plane.intent.etcd_store import Deposed, EtcdStore, Leadership, StoreUnavailable

log = logging.getLogger(__name__)

LeadershipListener = Callable[[Leadership | None, str], Awaitable[None]]


class LeaderElection:
    def __init__(
        self,
        store: EtcdStore,
        replica_id: str,
        ttl_s: int,
        *,
        info: Mapping[str, Any],
        on_change: LeadershipListener,
        clock: Callable[[], float] = time.monotonic,
        retry_s: float = 0.5,
    ) -> None:
        if ttl_s < 2:
            raise ValueError("leader lease TTL must be at least 2 s")
        self.store = store
        self.replica_id = replica_id
        self.ttl_s = ttl_s
        self.info = dict(info)
        self.on_change = on_change
        self.clock = clock
        self.retry_s = retry_s
        self.leadership: Leadership | None = None
        self.lease: int | None = None  # this session's lease (its registration's), while held
        self.reachable = False
        self.unreachable_since: float | None = None
        self._refreshed_at = 0.0
        self.campaigned = asyncio.Event()  # set once a campaign said whether this one leads

    def leading(self) -> Leadership | None:
        """This replica's leadership, if its lease is certainly still alive."""
        if self.leadership is None or self.clock() - self._refreshed_at >= self.ttl_s:
            return None
        return self.leadership

    async def run(self) -> None:
        while True:
            try:
                await self._session()
            except (StoreUnavailable, Deposed) as err:
                self._unreachable(str(err))
                await self._set(None, f"etcd: {err}")
            except Exception as err:  # never let the election die: it is retried
                log.exception("replica %s: leader election failed", self.replica_id)
                self._unreachable(f"{type(err).__name__}: {err}")
                await self._set(None, f"election failed: {type(err).__name__}: {err}")
            await asyncio.sleep(self.retry_s)

    async def resign(self) -> None:
        """Give the term up at once (clean shutdown): a follower takes over without waiting."""
        lead, self.leadership = self.leadership, None
        if lead is not None:
            with contextlib.suppress(StoreUnavailable):
                await self.store.revoke_lease(lead.lease_id)

    async def _session(self) -> None:
        self.lease = None
        lease = await self.store.grant_lease(self.ttl_s)
        self._refreshed_at = self.clock()
        await self.store.register(self.replica_id, self.info, lease)
        self.lease = lease
        self._reachable()
        while True:
            lead = await self.store.campaign(self.replica_id, lease)
            if lead is not None:
                await self._set(lead, f"elected for term {lead.term}")
                self.campaigned.set()
                why = await self._keep(lease, lead)
                await self._set(None, why)
                return
            self.campaigned.set()
            await self._keep(lease, None)

    async def _keep(self, lease: int, lead: Leadership | None) -> str:
        """Refresh the lease every TTL/3. As leader (`lead`): until it is lost or the leader
        key is no longer this term's. As follower: until the leader key changes (then campaign
        again). Why it returned."""
        changes = self.store.watch_leader()
        waiter: asyncio.Task[Any] | None = None
        try:
            while True:
                if waiter is None:
                    waiter = asyncio.ensure_future(anext(changes))
                due = self._refreshed_at + self.ttl_s / 3 - self.clock()
                done = (await asyncio.wait({waiter}, timeout=due))[0] if due > 0 else set()
                if done:
                    waiter.result()
                    waiter = None
                    if lead is None:
                        return "the leader key changed"
                    if not await self.store.holds(self.replica_id, lead):
                        log.warning("replica %s: the leader key is no longer term %d's: "
                                    "giving the lead up", self.replica_id, lead.term)
                        return "the leader key was taken"
                    continue
                remaining = await self.store.refresh_lease(lease)
                if remaining <= 0:
                    return "lease lost"
                self._refreshed_at = self.clock()
        finally:  # bounded: with etcd gone, a watch's own clean-up must not hold us here
            if waiter is not None:
                waiter.cancel()
                await asyncio.wait({waiter}, timeout=self.ttl_s)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(changes.aclose(), self.ttl_s)

    async def _set(self, lead: Leadership | None, why: str) -> None:
        if lead == self.leadership:
            return
        self.leadership = lead
        log.info("replica %s: %s", self.replica_id, why)
        await self.on_change(lead, why)

    def _reachable(self) -> None:
        self.reachable = True
        self.unreachable_since = None

    def _unreachable(self, why: str) -> None:
        if self.reachable or self.unreachable_since is None:
            log.warning("replica %s: etcd unreachable: %s", self.replica_id, why)
            self.unreachable_since = self.clock()
        self.reachable = False
