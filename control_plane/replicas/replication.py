"""One replica among several on etcd: who reconciles, how every replica holds the same intent, and
how decision records reach every replica's log.

- **Leadership** (`leadership.py`): exactly one replica leads. The service's manager
  (`manager.py`) runs what only the leader runs (the reconcile loop, the rollout driver's looks)
  and tells this replica when it is elected (`took_lead`: the whole intent read back from etcd,
  with the rollout it holds, in one change transaction: the shift goes on from where the last
  leader left it) and when it lost the lead (`lost_lead`: what etcd holds adopted); its writes
  would be refused anyway once it lost the lead (fenced by term).
- **Mirror**: every replica watches ``intent/`` and adopts each change into its own intent owner
  (a rollout's state first: which PoP serves which desired-state version, `rollouts.follow`),
  which publishes to its own output cache, so an Envoy of a PoP gets the same versions whichever
  replica it is connected to. The leader adopts too (its own writes come back equal: nothing to
  do), which also covers a write whose answer was lost. Never part of a write: nothing is
  adopted while ``intent/writing`` marks a split write under way (`etcd_store.marked`).
- **Decision hand-off**: records this replica writes are stamped with its id (and term, while
  leading) and published under ``decisions/<replica>/``; the others append them to their logs.
- **Node ACKs**: an Envoy streams from one replica, so each replica publishes its nodes' ACK
  state and newest NACKs (`shared_acks.py`, `SharedAcks`) under ``acks/<replica>``, on its
  registration's lease (a dead replica's nodes drop out when it expires), when they changed
  (looked at every `SHARE_POLL_S`: one write per change burst, whatever the number of ACKs),
  and takes the others' from the same watch: the leader's rollout gates, and every replica's
  status, count the nodes of every live replica (`peer_acks`: a registered replica whose value
  is missing or unreadable stands there as unknown, and the gates wait for it).
- **Bad values**: a value under ``intent/`` that is not what its key holds (another writer's,
  a bit flip) is quarantined (`replicated_store.checked`): left out on every replica alike, an
  `intent_quarantined` record naming the key and why (once, until it is rewritten or deleted),
  listed under `quarantined` in `/status`; start-up and adoption go on without it. A value of
  ``decisions/`` that is not JSON is skipped with a log line. The mirror's own failures are
  logged once each, not at every retry.
- **Fail static**: while etcd is unreachable nobody reconciles, every replica keeps serving the
  intent it holds, and `/readyz` says degraded (still 200: Envoys are better served by a replica
  with the last intent than by none).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from control_plane.acks.config_acks import ConfigAcks
from control_plane.acks.shared_acks import MAX_PEERS, MAX_TEXT_CHARS, SharedAcks
from control_plane.decisions.log import draft
from control_plane.decisions.recorder import DecisionRecorder
from control_plane.intent.etcd_store import (
    WRITING,
    EtcdStore,
    Leadership,
    StoreUnavailable,
    Unreadable,
)
from control_plane.intent.owner import IntentOwner
from control_plane.intent.replicated_store import ReplicatedStore, checked
from control_plane.intent.store import StoredIntent
from control_plane.observe.source import wall_ms
from control_plane.own_metrics.registry import BallastMetrics
from control_plane.replicas.leadership import LeaderElection, LeadershipListener
from control_plane.security.terminal import escape

log = logging.getLogger(__name__)

MAX_FORWARD_QUEUE = 10_000
ADOPT_RETRY_S = 1.0  # a follower whose adopt failed tries again this often until it lands
SHARE_POLL_S = 0.25  # how often a replica looks whether its nodes' ACK state changed
QUARANTINE_SHOWN = 20  # quarantined keys listed in /status (all are counted)


# what makes the store's intent this replica's (`Rollouts.adopt`): the intent, the rollout under
# it; with `elected`, a new leader's bookkeeping; `records` recorded with it
Adopt = Callable[..., Awaitable[frozenset[str]]]


class Replication:
    def __init__(
        self,
        etcd: EtcdStore,
        replica_id: str,
        *,
        ttl_s: int,
        owner: Callable[[], IntentOwner],
        recorder: DecisionRecorder,
        info: dict[str, Any],
        metrics: BallastMetrics | None = None,
        survey_s: float = 1.0,
        adopt: Callable[[], Adopt | None] = lambda: None,
        acks: Callable[[], ConfigAcks | None] = lambda: None,
        on_leadership: LeadershipListener | None = None,
        adopting: Callable[[], bool] | None = None,
        clock: Callable[[], int] = wall_ms,
    ) -> None:
        """`adopt`: how the intent and the rollout the leader saved become this replica's
        (`Rollouts.adopt`; None: the intent alone, `IntentOwner.adopt`); `acks`: this
        replica's nodes' ACK state, shared with the others (None: nothing shared);
        `on_leadership`: the election's listener (the service's manager, which starts and
        stops what only the leader runs and calls `took_lead` and `lost_lead`; None: nobody
        listens); `adopting`: whether the mirror adopts what etcd holds now (the manager's:
        not while this replica leads; default: while no term was taken); `clock`: wall ms, the
        time a peer's NACK is first read."""
        self.etcd = etcd
        self.survey_s = survey_s
        self.replica_id = replica_id
        self._owner = owner
        self.recorder = recorder
        self.decisions = recorder.log
        self._adopt_with = adopt
        self._acks = acks
        self._adopting = adopting or (lambda: self.term is None)
        self._metrics = metrics
        self._clock = clock
        self.election = LeaderElection(etcd, replica_id, ttl_s, info=info,
                                       on_change=on_leadership or _nobody)
        self.store = ReplicatedStore(etcd, self.election.leading, self._quarantine)
        self.quarantined: dict[str, str] = {}  # intent key -> why it is left out
        self._mirror_error = ""  # the mirror's last failure, logged once
        self.term: int | None = None  # the term this replica leads (`took_lead`)
        self.leader: tuple[str, int] | None = None  # (replica, term) as etcd said last
        self.replicas: list[dict[str, Any]] = []
        self._outbox: list[dict[str, Any]] = []
        self._queued = asyncio.Event()
        self._dropped = 0
        self._values: dict[str, Any] = {}
        self._membership_changed = asyncio.Event()
        self._behind = False  # the last adopt failed: what is served lags what etcd holds
        self.followed = 0  # the etcd revision whose changes the mirror has taken (and adopted)
        self._peer_values: dict[str, SharedAcks] = {}  # the other replicas' `acks/` values
        self.decisions.origin = {"replica": replica_id}
        self.decisions.add_listener(self._queue_record)

    # -- the faces -------------------------------------------------------------------------

    def peer_acks(self) -> dict[str, SharedAcks]:
        """The nodes of every other registered replica (live: its registration is on its
        lease): what it shares, or unknown when its value is unreadable or it shares none yet
        — the gates fail closed on it (`config_acks.py`). A value under an id no replica is
        registered with counts for nothing."""
        peers: dict[str, SharedAcks] = {}
        for registered in self.replicas:
            replica = str(registered.get("id"))
            if replica == self.replica_id:
                continue
            if len(peers) >= MAX_PEERS:
                break
            peers[replica] = self._peer_values.get(replica) or SharedAcks.unknown(
                "registered, but shares no ACK state")
        return peers

    def degraded(self) -> str | None:
        """Why this replica is degraded (etcd unreachable), or None."""
        since = self.election.unreachable_since
        if since is None:
            return None
        return f"intent store unreachable for {time.monotonic() - since:.0f} s: reconcile paused"

    def status(self) -> dict[str, Any]:
        """This replica, the leader and every registered replica (as last read from etcd)."""
        leader = self.leader
        return {
            "replica": self.replica_id,
            "leading": self.election.leading() is not None,
            "term": self.term,
            "leader": None if leader is None else {"replica": leader[0], "term": leader[1]},
            "replicas": self.replicas,
            "store": self.store.where,
            "store_reachable": self.election.reachable,
            "degraded": self.degraded(),
            "records_waiting": len(self._outbox),
            "records_dropped": self._dropped,  # the outbox was full while etcd was away
            "quarantined": dict(list(self.quarantined.items())[:QUARANTINE_SHOWN]),
            "quarantined_count": len(self.quarantined),
        }

    def _quarantine(self, bad: Mapping[str, str]) -> None:
        """The intent keys left out now (`ReplicatedStore.intent_of`): each newly bad one (or
        bad for another reason) logged and recorded once, each good again logged."""
        for key, why in bad.items():
            if self.quarantined.get(key) != why:
                shown = escape(key[:200])
                log.warning("etcd value intent/%s left out (quarantined): %s", shown,
                            escape(why))
                self.recorder.record(
                    "intent_quarantined", rule=f"the value of {self.store.where}intent/"
                    f"{shown} is left out: {why}; rewrite or delete it",
                    detail={"key": f"intent/{shown}", "why": why, "replica": self.replica_id})
        for key in self.quarantined.keys() - bad.keys():
            log.info("etcd value intent/%s is readable again (or gone)", escape(key[:200]))
        self.quarantined = dict(bad)

    # -- lifecycle ------------------------------------------------------------------------

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        """What runs on every replica until the stop (the service's manager runs them): the
        election, the mirror of etcd, the hand-off of records, the survey of who is there, the
        sharing of this replica's nodes' ACKs."""
        return [self.election.run(), self._mirror(), self._forward(),
                self._survey(self.survey_s), self._share_acks()]

    async def _survey(self, every_s: float) -> None:
        """Who leads and which replicas are registered, for status (never awaited by it), and
        this replica's role in /metrics: read again as soon as the intent watch sees the leader
        key or a registration change (else a follower's status would name no leader, or miss
        a replica, for up to `every_s` after an election), and every `every_s` anyway."""
        while True:
            self._membership_changed.clear()
            with contextlib.suppress(StoreUnavailable):
                await self.read_leader()
                self.replicas = sorted(await self.etcd.replicas(),
                                       key=lambda r: str(r.get("id")))
            if self._metrics is not None:
                me = self.replica_id
                self._metrics.replica_leading.labels(me).set(self.term is not None)
                self._metrics.leader_term.labels(me).set(self.term or 0)
                self._metrics.intent_store_reachable.labels(me).set(self.election.reachable)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._membership_changed.wait(), every_s)

    async def read_leader(self) -> tuple[str, int] | None:
        """Who leads, read from etcd now (and kept for status)."""
        self.leader = await self.etcd.leader()
        return self.leader

    async def leave(self) -> None:
        """At the stop, once the loops ended: the records not yet handed on written to etcd,
        this replica's nodes taken out of the shared ACKs, the term given up at once."""
        await self._flush()
        lease = self.election.lease
        if lease is not None:  # its nodes reconnect elsewhere: they are not this one's now
            with contextlib.suppress(StoreUnavailable):
                await self.etcd.share_acks(self.replica_id, None, lease)
        await self.election.resign()

    async def _share_acks(self) -> None:
        """This replica's nodes' ACK state into etcd whenever it changed (see the module
        docstring), again on a new session's lease; kept for the next look when etcd fails."""
        acks = self._acks()
        if acks is None:
            return
        shared: tuple[int, dict[str, Any]] | None = None  # (lease, value) etcd holds
        seen = -1
        while True:
            await asyncio.sleep(SHARE_POLL_S)
            lease = self.election.lease
            if lease is None or (acks.generation == seen and shared is not None
                                 and shared[0] == lease):
                continue
            seen = acks.generation
            value = acks.shared().to_json()
            if shared == (lease, value):
                continue
            try:
                await self.etcd.share_acks(self.replica_id, value, lease)
            except StoreUnavailable as err:
                log.debug("sharing the nodes' ACKs: %s", err)
                seen = -1  # looked at again after a second (as records are: `_forward`)
                await asyncio.sleep(1)
                continue
            shared = (lease, value)

    # -- leadership (told by the manager) --------------------------------------------------

    async def took_lead(self, term: int) -> None:
        """Elected for `term`: the whole intent read back from etcd and made this replica's,
        with the rollout it holds, in one change transaction that saves what a leader must
        hold of the rollout and records `leader_elected` (a StoreUnavailable here drops the
        lead again); a split write the last leader broke off settled."""
        self.term = term
        self.decisions.origin = {"replica": self.replica_id, "term": term}
        stored = await self.store.read()
        elected = draft("leader_elected", rule=f"replica {self.replica_id} leads term {term}: "
                        "reconciling from the intent in etcd", detail={
                            "replica": self.replica_id, "term": term,
                            "pairs_restored": len(stored.groups)})
        await self._adopted(stored, elected=f"replica {self.replica_id} leads term {term}",
                            records=[elected])
        await self.store.settle()  # a write the last leader broke off is over

    async def lost_lead(self, why: str) -> None:
        """The lead lost (the manager stopped what only the leader runs): recorded, and what
        etcd holds adopted (its own last writes, or a new leader's)."""
        if self.term is not None:
            self.recorder.record("leader_lost", rule=f"replica {self.replica_id} stopped "
                                 f"reconciling term {self.term}: {why}",
                                 detail={"replica": self.replica_id, "term": self.term})
        self.decisions.origin = {"replica": self.replica_id}
        self.term = None
        await self._adopt()

    async def _adopted(self, stored: StoredIntent, **how: Any) -> frozenset[str]:
        adopt = self._adopt_with()
        if adopt is not None:
            return await adopt(stored, self.store.where, **how)
        return await self._owner().adopt(stored, where=self.store.where,
                                         records=how.get("records", ()))

    # -- mirror ----------------------------------------------------------------------------

    async def _mirror(self) -> None:
        while True:
            try:
                revision, values = await self.etcd.load()
                self._values = values
                self.followed = revision
                before, self._peer_values = self._peer_values, {}
                for replica, value in (await self.etcd.shared_acks()).items():
                    self._take_acks(replica, value, before.get(replica))
                self._membership_changed.set()  # what changed before the watch: surveyed now
                await self._adopt()
                await self._follow(revision + 1)
            except StoreUnavailable as err:
                log.debug("intent watch: %s", err)
            except Exception as err:  # the mirror must go on: it is how this replica follows
                if str(err) != self._mirror_error:  # once per failure, not every 0.5 s
                    log.exception("intent watch failed")
                self._mirror_error = str(err)
            await asyncio.sleep(0.5)

    async def _follow(self, start_revision: int) -> None:
        """Adopt the watched changes, once per burst (one leader commit is several events).
        While the last adopt failed (`_behind`: a swap that raised), it is tried again every
        `ADOPT_RETRY_S` until it lands, so what is served catches up with what is stored even
        when nothing more changes in etcd."""
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def read() -> None:
            try:
                async for event in self.etcd.watch_intent(start_revision):
                    queue.put_nowait(event)
                queue.put_nowait(StoreUnavailable("intent watch ended"))
            except StoreUnavailable as err:
                queue.put_nowait(err)

        reader = asyncio.create_task(read())
        try:
            while True:
                burst = []
                with contextlib.suppress(TimeoutError):  # behind: adopt again
                    burst.append(await asyncio.wait_for(
                        queue.get(), ADOPT_RETRY_S if self._behind else None))
                while not queue.empty():
                    burst.append(queue.get_nowait())
                changed = False
                for item in burst:
                    if isinstance(item, StoreUnavailable):
                        raise item
                    changed = self._take(item) or changed
                if changed or self._behind:
                    await self._adopt()
                self.followed = max([self.followed, *(item.revision for item in burst)])
        finally:  # bounded: the watch's clean-up talks to etcd, which may be gone
            reader.cancel()
            await asyncio.wait({reader}, timeout=5)

    def _take(self, event: Any) -> bool:
        """Apply one watch event to the mirrored values; True if the intent changed."""
        if event.key == "leader" or event.key.startswith("replicas/"):
            self._membership_changed.set()  # status shows the new leader or replica at once
            return False
        if event.key.startswith("acks/"):
            replica = event.key.removeprefix("acks/")
            self._take_acks(replica, event.value, self._peer_values.get(replica))
            return False
        if event.key.startswith("decisions/"):
            source = event.key.split("/")[1]
            if isinstance(event.value, Unreadable):
                log.warning("ignored a replicated record under %s: %s", event.key[:200],
                            event.value.why)
                return False
            if event.value is not None and source != self.replica_id:
                try:
                    self.recorder.replicated(event.value)
                except ValueError as err:
                    log.warning("ignored a replicated record: %s", err)
            return False
        key = event.key.removeprefix("intent/")
        if event.value is None:
            return self._values.pop(key, None) is not None
        if self._values.get(key) == event.value:
            return False
        self._values[key] = event.value
        return True

    def _take_acks(self, replica: str, raw: bytes | None, before: SharedAcks | None) -> None:
        """Another replica's nodes, as etcd holds them (None: its key went, with its lease or
        its stop); `before`: what was last read of them (its NACKs keep their time)."""
        if replica == self.replica_id:
            return
        if raw is None:
            self._peer_values.pop(replica, None)
            return
        if len(replica) > MAX_TEXT_CHARS or (replica not in self._peer_values
                                             and len(self._peer_values) >= MAX_PEERS):
            log.warning("ignored the nodes' ACKs shared under %r: more than %d replicas, or "
                        "the id is longer than %d characters", replica[:64], MAX_PEERS,
                        MAX_TEXT_CHARS)
            return
        try:
            self._peer_values[replica] = SharedAcks.parse(replica, raw).received(
                before, self._clock())
        except ValueError as err:
            self._peer_values[replica] = SharedAcks.unknown(f"its shared value is unreadable "
                                                            f"({err})")
            log.warning("the nodes' ACKs replica %s shared are unreadable: %s", replica[:64],
                        err)

    async def _adopt(self) -> None:
        """Followers only: the leader's own intent is ahead of what its watch has delivered.
        Through the change transaction, which saves nothing here (the leader saved it). If it
        fails, the last intent is kept and `_behind` set (the mirror tries again)."""
        behind, self._behind = self._behind, False
        if not self._adopting():  # the leader: for its quarantine only
            self._quarantine(checked(self._values)[1])
            return
        if WRITING in self._values:  # the leader's write is under way: adopt it once whole
            log.debug("a write is under way in etcd: adopted when it is whole")
            return
        try:
            stored = self.store.intent_of(self._values)
            # which PoP serves which version, and the intent under those versions: one change
            pops = await self._adopted(stored)
            log.debug("adopted the intent from etcd; output changed in %s",
                      ", ".join(sorted(pops)) or "no PoP")
        except Exception:  # a bad key in etcd must not stop the mirror: keep the last intent
            if not behind:  # once, not at every retry
                log.exception("could not adopt the intent from etcd; keeping the last one")
            self._behind = True

    # -- decision hand-off -----------------------------------------------------------------

    def _queue_record(self, record: dict[str, Any]) -> None:
        """Records this replica wrote go to the others (replicated ones came from them)."""
        if record.get("replica") != self.replica_id:
            return
        if len(self._outbox) >= MAX_FORWARD_QUEUE:
            self._dropped += 1
            return
        self._outbox.append(record)
        self._queued.set()

    async def _forward(self) -> None:
        """Records go out as soon as they are written: one transaction at a time, so what
        arrives while one is in flight goes in the next (a tick's records travel together)."""
        while True:
            await self._queued.wait()
            self._queued.clear()
            try:
                await self._flush()
            except StoreUnavailable:
                await asyncio.sleep(1)  # kept in the outbox until etcd answers again
                self._queued.set()

    async def _flush(self) -> None:
        if not self._outbox:
            return
        batch, self._outbox = self._outbox, []
        try:
            await self.etcd.publish_records(self.replica_id, batch)
        except StoreUnavailable:
            self._outbox = batch + self._outbox  # kept (bounded) until etcd is back
            del self._outbox[MAX_FORWARD_QUEUE:]
            raise


async def _nobody(lead: Leadership | None, why: str) -> None:
    """No listener: a replica run on its own (a test's follower)."""
