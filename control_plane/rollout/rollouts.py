"""`Rollouts`: the shell of a rollout — what moves PoPs from one desired-state version to the next.

The decisions are the pure core's (`decide/rollout.py`: waves, bake, gates, rollback,
supersede, the operator's actions); this module feeds it and publishes what it decides:

- **inputs**: the clock, the ACKs and NACKs of the reached PoPs' nodes (`config_acks.py`, read
  from the ADS streams; with replicas, of every live replica's streams, shared through etcd)
  and the signal windows from the metric source the weight controller reads (per PoP, group
  and origin: the wave's PoPs over their own traffic — from just after their nodes' first
  stats flush after each applied the change, `own_starts` —, the PoPs still on the previous
  version since
  the wave started, the wave's PoPs before it started), with each tier's requests and sheds
  from the access logs (`AccessLogStore.sheds`: the shed rate) and the tier-action onsets
  since the wave started;
- **publishing**: every rollout decision that changes which PoP serves which version — a reload
  starting (or superseding) one, a wave starting, a rollback, an abort, a promote — is one
  change through the change transaction (`change.desired(target, serving=...)`): the output of
  the PoPs that move built off the loop, then one store write (the rollout's state, the bytes
  of the versions it needs, which PoP serves which version), the records (the core's events,
  through the one decision recorder), the swap. A decision that moves no PoP (a pause) is the
  same transaction with nothing served changing (`change.keep`).

Versions: the bytes of every version a PoP serves, or a rollback may need (the rollout's
`from_version` and `to_version`), are kept in memory and in the store (kind
`desired_version`), so a restart (`restored`) serves exactly what was served before it: the
rollout resumes from its saved state. A version that failed (rolled back, aborted) is kept by
digest (`failed`): the reload does not apply the same bytes again. How the store keeps a
rollout, and reads it back, is the intent's (`intent/rollout_state.py`); this module states
the records in the changes that publish its decisions.

One rollout at a time: `lock` is held by every look, operator action and the reload that
starts or supersedes one, so each reads the rollout it changes. With replicas only the leader
starts, looks at or supersedes a rollout, or acts on it (`begin`, `look` and `act` refuse
elsewhere); the others `follow` what it saved.

A decision whose swap failed (`SwapFailed`: the store was put back, nothing served changed) had
its records written already (the transaction writes them before the swap). It is kept
(`Unpublished`) and carried out as decided — its times, its records not written again — by the
next look (an operator's action too: the log says it was asked, and so it is done), or by the
same action asked again, while the rollout is still the one it was decided from; any other
published change of the rollout (an operator's other action, a new version) drops it, its
records then followed in the log by what was published instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from control_plane.acks.config_acks import ConfigAcks
from control_plane.decide.gates import GateInputs, NodeAck, PopWindow, TierShed
from control_plane.decide.rollout import (
    PHASES,
    Rollout,
    RolloutError,
    RolloutEvent,
    abort,
    failed_version,
    last_passed,
    pause,
    promote,
    reached,
    renew,
    renewal,
    resume,
    serving_since,
    start,
    supersede,
)
from control_plane.decide.rollout import look as rollout_look
from control_plane.decisions.log import Draft, draft
from control_plane.decisions.recorder import DecisionRecorder
from control_plane.desired import DesiredStateError, parse_desired
from control_plane.desired.model import Desired, TierActions
from control_plane.intent.change import Change, Records, SwapFailed
from control_plane.intent.etcd_store import Deposed
from control_plane.intent.owner import IntentOwner
from control_plane.intent.rollout_state import (
    ROLLOUT_KEY,
    Restored,
    Version,
    restored,
    serving_of,
    target_of,
    window_json,
)
from control_plane.intent.store import (
    ROLLOUT_BEFORE_KIND,
    ROLLOUT_KIND,
    VERSION_KIND,
    StoredIntent,
    StoreRecord,
)
from control_plane.observe.source import MetricSource, Signals, wall_ms
from control_plane.own_metrics.registry import BallastMetrics

log = logging.getLogger(__name__)

MAX_FAILED = 32  # failed versions remembered (the oldest forgotten first)
ACTIONS: dict[str, Callable[[Rollout, int, str], tuple[Rollout, tuple[RolloutEvent, ...]]]] = {
    "pause": pause, "resume": resume, "abort": abort, "promote": promote}


@dataclass(frozen=True)
class _Held:
    """A rollout driver's state: the rollout, the failed versions, the versions it keeps, the
    digests whose bytes the store holds, the reached PoPs' baselines."""

    rollout: Rollout | None
    failed: Mapping[str, str]
    versions: Mapping[str, Version]
    saved: frozenset[str]
    before: Mapping[str, PopWindow]

    @classmethod
    def of(cls, held: Restored) -> _Held:
        return cls(held.rollout, dict(held.failed), dict(held.versions), held.saved,
                   dict(held.before))


def _rebaked(rollout: Rollout | None, now: int, why: str) -> Rollout | None:
    """The wave in progress baking again from `now` (`Rollouts.rebake`)."""
    if rollout is None or not rollout.in_progress:
        return rollout
    return replace(rollout, wave_started_ms=now, gate=None, updated_ms=now,
                   reason=f"{rollout.reason}; wave {rollout.wave + 1} bakes again from now: "
                   f"{why}")


@dataclass(frozen=True)
class Unpublished:
    """A decision recorded whose swap failed: the rollout it was decided from, the rollout it
    makes, its events (recorded already) and the baselines captured for it."""

    before: Rollout
    after: Rollout
    events: tuple[RolloutEvent, ...]
    captured: Mapping[str, PopWindow]

    def carries(self, before: Rollout | None, after: Rollout,
                events: Iterable[RolloutEvent]) -> bool:
        """Whether deciding `after` (`events`) from `before` is this decision again."""
        return (before == self.before and (after.phase, after.wave) == (
            self.after.phase, self.after.wave)
            and [e.kind for e in events] == [e.kind for e in self.events])


@dataclass(frozen=True)
class Begun:
    """A rollout decision stated on a change: its records, and what to call once the change
    published (the driver takes the new state then, not before)."""

    records: tuple[Draft, ...]
    done: Callable[[], None]


class Rollouts:
    def __init__(
        self,
        owner: IntentOwner,
        acks: ConfigAcks,
        source: MetricSource,
        recorder: DecisionRecorder,
        running: Version,
        *,
        metrics: BallastMetrics | None = None,
        clock: Callable[[], int] = wall_ms,
        changed: Callable[[], None] = lambda: None,
        parse: Callable[[bytes, str], Desired] = parse_desired,
        saved: Iterable[str] = (),
        stats_after: Callable[[str, str, int, int], int | None] | None = None,
        sheds: Callable[[int, int], Mapping[tuple[str, str, str], tuple[int, int]]]
        | None = None,
    ) -> None:
        """`saved`: the digests whose bytes the store holds (a baseline, `baseline`)."""
        self.owner = owner
        self.acks = acks
        self.source = source
        self.recorder = recorder
        self.metrics = metrics
        self.clock = clock
        self._changed = changed  # told after each change of which PoP serves what
        self._parse = parse  # how a stored version is read again (the service's filter list)
        self.lock = asyncio.Lock()
        self.rollout: Rollout | None = None
        self.failed: dict[str, str] = {}  # digest -> why it failed
        self._versions: dict[str, Version] = {running.digest: running}
        self._saved: set[str] = set(saved)  # digests whose bytes the store holds
        # PoP -> its groups demoting or shedding when the wave started (onsets count from it)
        self._actions_at_wave: dict[str, frozenset[str]] = {}
        self._before: dict[str, PopWindow] = {}  # reached PoP -> its window before its wave
        self._unpublished: Unpublished | None = None  # recorded, its swap failed
        # where a window of a node's stats taken after a time starts (the sink knows each
        # node's flushes, `SinkStore.stats_after`; None: a source that does not, e.g.
        # Prometheus): where a wave's own window starts (`own_starts`)
        self._stats_after = stats_after
        # (now, window) -> (PoP, group, tier) -> (requests, shed): the tiers' shed rate
        self._sheds = sheds
        # (version, wave start) and when each node of the wave was first seen applying it
        self._acked_wave: tuple[str, int] | None = None
        self._acked_at: dict[tuple[str, str], int] = {}
        self._gauges()

    # -- start-up --------------------------------------------------------------------------

    def restore(self, held: Restored) -> None:
        """What the store held (`restored`) taken as the driver's state (before serving)."""
        self._take(_Held.of(held))

    def rebake(self, why: str) -> None:
        """The wave in progress bakes again from now (a restart, a new leader): the ACKs and
        readings of before are gone with the process that had them, and nodes reconnect now;
        its gate judges a fresh bake, its ACK timeout counts from now. Saved with the next
        look."""
        self.rollout = _rebaked(self.rollout, self.clock(), why)
        self._note_wave()

    def _held(self) -> _Held:
        return _Held(self.rollout, dict(self.failed), dict(self._versions),
                     frozenset(self._saved), dict(self._before))

    def _take(self, held: _Held) -> None:
        self.rollout = held.rollout
        self.failed = dict(held.failed)
        self._versions = dict(held.versions)
        self._saved = set(held.saved)
        self._before = dict(held.before)
        self._note_wave()
        self._gauges()

    async def adopt(self, stored: StoredIntent, where: str, *, elected: str | None = None,
                    records: Records = ()) -> frozenset[str]:
        """A replica taking what the shared store holds, in one change transaction (saving
        nothing its leader saved): the rollout the leader saved (which PoP serves which version)
        and the intent under it (`IntentOwner.adopt`). `elected`: this replica was just elected
        (why): the rollout in progress bakes again from now, and what the store must hold of it
        (`settlement`) is saved with the change; `records` are recorded with it. Nothing of the
        driver changes when the change raises. The PoPs whose output changed."""
        held = await asyncio.to_thread(restored, stored.records, dict(self._versions),
                                       self._parse, where, self.clock())
        async with self.lock:
            follows = held is not None and (held.rollout != self.rollout
                                            or held.failed != self.failed)
            if follows and held is not None and held.renamed:
                log.warning("the certificate files of %s read differently here than where "
                            "they were saved: this replica serves what its own files hold",
                            ", ".join(d[:16] for d in sorted(held.renamed)))
            now = _Held.of(held) if follows and held is not None else self._held()
            settled = None
            if elected is not None:
                now = replace(now, rollout=_rebaked(now.rollout, self.clock(), elected))
                settled = self._settlement(now)
            pops = await self.owner.adopt(
                stored, where=where,
                desired=held.target.desired if follows and held is not None else None,
                serving=held.serving if follows and held is not None else None,
                keep=((), ()) if settled is None else settled[:2], records=records)
            self._take(now)
            if settled is not None:
                settled[2]()
            if follows:
                self._changed()
            return pops

    # -- a new version (the reload) --------------------------------------------------------

    async def begin(self, change: Change, new: Version, *, immediate: bool, by: str) -> Begun:
        """State on `change` (a reload's) the rollout of `new`: started, or superseding the
        one in progress; its records and what to call once the change published. Call under
        `lock`. Only the leader starts or supersedes a rollout (the others follow what it
        saved): a follower's reload never gets here, and a lead lost since is refused by the
        store's fenced write (`Deposed`)."""
        now = self.clock()
        running = self.owner.intent
        versions = {**self._versions, new.digest: new}
        current = self.rollout
        if current is not None and current.in_progress and not immediate \
                and new.digest not in (current.to_version, current.from_version):
            renewed = await asyncio.to_thread(renewal, versions[current.to_version].desired,
                                              new.desired)
            if renewed:  # the rollout goes on where it is (not superseded)
                return await self._renew(change, current, new, renewed, versions, now, by)
        last = running.desired if current is None else versions[last_passed(current)].desired
        renewed = await asyncio.to_thread(renewal, last, new.desired)
        if current is None:
            rollout, events = start(new.desired.rollout, last.digest, new.digest,
                                    new.desired.pop_names, last.pop_names, now,
                                    immediate=immediate, by=by, renewed=renewed)
        else:
            _, rollout, events = supersede(current, new.desired.rollout, new.digest,
                                           new.desired.pop_names, last.pop_names, now,
                                           immediate=immediate, by=by, renewed=renewed)
        captured = await self._capture(None, rollout, new.desired)
        return self._state(change, rollout, events, versions, self.failed, captured)

    async def _renew(self, change: Change, rollout: Rollout, new: Version,
                     renewed: tuple[str, ...], versions: dict[str, Version], now: int, by: str
                     ) -> Begun:
        """`new` renews the version `rollout` rolls out (`decide/rollout.py`, `renew`): the
        last passed version is read again, with the renewed files, for the PoPs not reached."""
        again = await asyncio.to_thread(_read_again, versions[rollout.from_version], self._parse)
        if again is not None:
            versions[again.digest] = versions.get(again.digest, again)
        after, events = renew(rollout, new.desired.rollout, new.digest,
                              None if again is None else again.digest, renewed, now, by)
        return self._state(change, after, events, versions, self.failed, {})

    def settlement(self, held: _Held | None = None
                   ) -> tuple[list[StoreRecord], list[StoreRecord], Callable[[], None]] | None:
        """What the store must hold for this driver to serve from it (at start; with replicas,
        once elected), for the change that makes it so (records, undo, and what to call once it
        published), from `held` (default: the driver's state): with a rollout, its state under
        its versions' digests as read now (certificates renewed while Ballast was down rename
        them: `Restored.renamed`); without one, the bytes of the version served (`baseline`: a
        restart serves it, and a file edited while Ballast was down rolls out from it). None
        when the store holds that already."""
        return self._settlement(self._held() if held is None else held)

    def _settlement(self, held: _Held
                    ) -> tuple[list[StoreRecord], list[StoreRecord], Callable[[], None]] | None:
        rollout, versions = held.rollout, held.versions
        if rollout is not None:
            needed = {rollout.from_version, rollout.to_version} & set(versions)
            if held.saved == needed:
                return None
            return self._kept(rollout, {d: versions[d] for d in needed}, held.failed, {},
                              held.before, held)
        running = versions.get(self.owner.desired.digest)
        if running is None or held.saved == {running.digest}:
            return None
        records: list[StoreRecord] = [(VERSION_KIND, running.digest, running.stored())]
        records += [(VERSION_KIND, digest, None) for digest in sorted(held.saved)
                    if digest != running.digest]

        def done() -> None:
            self._saved = {running.digest}

        return records, [(VERSION_KIND, running.digest, None)], done

    def refused(self, digest: str) -> str | None:
        """Why a version's bytes are not applied again (it failed its rollout), or None."""
        return self.failed.get(digest)

    # -- the loop ----------------------------------------------------------------------------

    async def run(self, poll_ms: int = 1000) -> None:
        """Look at the rollout in progress every `poll_ms` until cancelled."""
        while True:
            try:
                await self.look()
            except Exception:  # the next look starts from the saved state
                log.exception("rollout look failed")
            await asyncio.sleep(poll_ms / 1000)

    async def look(self, now_ms: int | None = None) -> tuple[RolloutEvent, ...]:
        """One look at the rollout in progress: its gate judged, what it decides published."""
        async with self.lock:
            rollout = self.rollout
            if rollout is None or not rollout.in_progress:
                return ()
            unpublished = self._unpublished
            if unpublished is not None and unpublished.before == rollout:
                await self._publish(unpublished.after, unpublished.events)  # as decided
                return unpublished.events
            now = self.clock() if now_ms is None else now_ms
            target = self._versions[rollout.to_version].desired
            inputs = await self.inputs(rollout, now)
            # off the loop: the gates compare every reached PoP's keys (a large fleet's work)
            after, events = await asyncio.to_thread(rollout_look, rollout, inputs, now,
                                                    target.rollout)
            if not events:  # the latest gate reading, shown by the faces
                self.rollout = after
                return ()
            await self._publish(after, events)
            return events

    async def act(self, action: str, by: str) -> Rollout:
        """An operator's `pause`, `resume`, `abort` or `promote`; RolloutError when it does not
        apply (nothing changed). Operators act on the leader (`rollout_control.py` refuses the
        others' actions); a lead lost since is refused by the store's fenced write."""
        if action not in ACTIONS:
            raise RolloutError(f"unknown action {action!r}; known: {', '.join(ACTIONS)}")
        async with self.lock:
            if self.rollout is None:
                raise RolloutError("no rollout: nothing was applied since the start")
            after, events = ACTIONS[action](self.rollout, self.clock(), by)
            await self._publish(after, events)
            return after

    async def inputs(self, rollout: Rollout, now: int) -> GateInputs:
        """What the gates judge now: ACKs, NACKs, the windows (see the module docstring)."""
        wave = reached(rollout)
        running = self.owner.intent
        others = [pop for pop in running.pop_names if pop not in wave]
        span = max(now - rollout.wave_started_ms, 1)
        nodes = self.acks.nodes(sorted(wave))
        after = await self._window(now, span)
        onsets = self._onsets(running.tier_actions)
        sheds = await self._shed_counts(now, span)
        # each reached PoP's window starts at its nodes' first stats after they applied the
        # change (`own_starts`); a PoP whose nodes have not flushed since has no window yet
        starts = self.own_starts(rollout, nodes, now)
        own: list[PopWindow] = []
        by_start: dict[int, list[str]] = {}
        for pop in sorted(wave):
            start = starts.get(pop, rollout.wave_started_ms)
            if start is None or start >= now:
                own.append(PopWindow(pop, tier_action_onsets=onsets.get(pop, 0)))
            else:
                by_start.setdefault(start, []).append(pop)
        for start, pops in sorted(by_start.items()):
            signals = after if start == rollout.wave_started_ms else await self._window(
                now, now - start)
            counts = sheds if start == rollout.wave_started_ms else await self._shed_counts(
                now, now - start)
            own.extend(_windows(signals, pops, onsets, counts))
        # each reached PoP's own window before it got the new version: taken when its wave
        # started (the source may keep less than a rollout lasts), else read back now
        since: dict[int, list[str]] = {}
        for pop in sorted(wave - set(self._before)):
            since.setdefault(serving_since(rollout, pop) or rollout.wave_started_ms,
                             []).append(pop)
        before = [self._before[pop] for pop in sorted(wave) if pop in self._before]
        before += [window for at, pops in sorted(since.items())
                   for window in _windows(await self._window(at, span), pops, {},
                                          await self._shed_counts(at, span))]
        return GateInputs(
            nodes=nodes,
            nacks=self.acks.nacks(rollout.started_ms),
            after=tuple(sorted(own, key=lambda w: w.pop)),
            peers=_windows(after, others, onsets, sheds),
            before=tuple(before),
        )

    def own_starts(self, rollout: Rollout, nodes: Iterable[NodeAck], now: int
                   ) -> dict[str, int | None]:
        """Reached PoP -> where its window of the change's own traffic starts, the latest over
        its nodes; None while one of them has not applied the version or not flushed since.
        A node's ACK time is when its ACK arrived (its replica says; else when a look first saw
        it applied, never earlier); its window starts just after its first stats flush after
        that (both of the flush's
        streams, `SinkStore.stats_after`): that flush closes the interval the ACK fell in, so
        it still holds traffic served on the old version. Without per-node flush times
        (Prometheus: counters scraped live, histograms as of the last flush), a flush interval
        and a half after the ACK. PoPs without nodes are left out."""
        key = (rollout.to_version, rollout.wave_started_ms)
        if self._acked_wave != key:
            self._acked_wave, self._acked_at = key, {}
        flush = self._versions[rollout.to_version].desired.rollout.stats_flush_interval_ms
        starts: dict[str, int | None] = {}
        for node in nodes:
            if node.acked != rollout.to_version:
                starts[node.pop] = None
                continue
            at = self._acked_at.setdefault((node.pop, node.node), node.acked_ms or now)
            if self._stats_after is None:
                mine: int | None = at + flush + flush // 2
            else:
                mine = self._stats_after(node.node, node.pop, at, flush)
            if node.pop in starts and starts[node.pop] is None:
                continue
            was = starts.get(node.pop)
            starts[node.pop] = None if mine is None else max(mine, was or mine)
        return starts

    # -- publishing --------------------------------------------------------------------------

    async def _publish(self, after: Rollout, events: tuple[RolloutEvent, ...]) -> None:
        """`after` published; the decision kept (`Unpublished`) when its swap fails, carried
        out as it was decided, its records not written again, when it is decided again."""
        before, unpublished = self.rollout, self._unpublished
        again = unpublished is not None and unpublished.carries(before, after, events)
        if unpublished is not None and again:
            after, events, captured = unpublished.after, unpublished.events, unpublished.captured
        else:
            captured = await self._capture(before, after,
                                           self._versions[after.to_version].desired)
        try:
            # always saved: a replica that lost the lead since `look` or `act` looked gets
            # Deposed from the fenced write, so nothing is recorded or swapped here that the
            # fleet's store does not hold
            async with self.owner.change() as change:
                begun = self._state(change, after, events, self._versions, self.failed,
                                    captured)
                if not again:
                    change.record(begun.records)
        except SwapFailed:
            if before is not None:
                self._unpublished = Unpublished(before, after, events, captured)
            raise
        except Deposed as err:
            raise RolloutError(f"this replica no longer leads ({err}): the leader carries the "
                               "rollout on") from err
        begun.done()

    async def _capture(self, before: Rollout | None, after: Rollout, target: Desired
                       ) -> dict[str, PopWindow]:
        """The signals over the bake before now of the PoPs `after` reaches that `before` had
        not (they get the new version with this change): their own baseline for the gates,
        kept (and saved) while the rollout is in progress."""
        if not after.in_progress:
            return {}
        entering = sorted(reached(after) - (reached(before) if before is not None
                                            and _same_rollout(before, after)
                                            else frozenset()))
        if not entering:
            return {}
        now = self.clock()
        signals = await self._window(now, target.rollout.bake_ms)
        counts = await self._shed_counts(now, target.rollout.bake_ms)
        return {window.pop: window for window in _windows(signals, entering, {}, counts)}

    def _state(self, change: Change, rollout: Rollout, events: Iterable[RolloutEvent],
               versions: Mapping[str, Version], failed: Mapping[str, str],
               captured: Mapping[str, PopWindow]) -> Begun:
        """`rollout` stated on `change`: which PoP serves which version, the rollout's records
        in the store. Returns its events as decision records (for the change to record) and
        what makes it this driver's state once the change published."""
        needed = {rollout.from_version, rollout.to_version} & set(versions)
        kept = {digest: versions[digest] for digest in needed}
        change.desired(kept[target_of(rollout)].desired, serving=serving_of(rollout, kept))
        same = self.rollout is not None and _same_rollout(self.rollout, rollout)
        records, undo, done = self._kept(rollout, kept, failed, captured,
                                         self._before if same else {}, self._held())
        change.keep(records, undo)
        return Begun(tuple(rollout_draft(event) for event in events), done)

    def _kept(self, rollout: Rollout, kept: Mapping[str, Version], failed: Mapping[str, str],
              captured: Mapping[str, PopWindow], earlier: Mapping[str, PopWindow], was: _Held
              ) -> tuple[list[StoreRecord], list[StoreRecord], Callable[[], None]]:
        """The store records that hold `rollout` (its state, the failed versions, the bytes of
        the versions `kept`, the baselines: `earlier` ones of the same rollout and `captured`
        new ones) over what the store holds (`was`), what puts the store back, and what makes
        it this driver's state."""
        failed = dict(failed)
        refused = failed_version(rollout)
        if refused is not None:
            failed[refused] = rollout.reason
            for old in list(failed)[:-MAX_FAILED]:
                del failed[old]
        needed = set(kept)
        state = {"rollout": rollout.to_dict(), "failed": failed}
        before = None if was.rollout is None else {"rollout": was.rollout.to_dict(),
                                                   "failed": dict(was.failed)}
        records: list[StoreRecord] = [(ROLLOUT_KIND, ROLLOUT_KEY, state)]
        undo: list[StoreRecord] = [(ROLLOUT_KIND, ROLLOUT_KEY, before)]
        for digest in sorted(needed - was.saved):
            records.append((VERSION_KIND, digest, kept[digest].stored()))
            undo.append((VERSION_KIND, digest, None))
        for digest in sorted(was.saved - needed):
            records.append((VERSION_KIND, digest, None))
            if digest in was.versions:
                undo.append((VERSION_KIND, digest, was.versions[digest].stored()))
        baselines = {} if not rollout.in_progress else {**earlier, **captured}
        for pop in sorted(set(was.before) | set(baselines)):
            if pop in captured or pop not in baselines:
                records.append((ROLLOUT_BEFORE_KIND, pop, None if pop not in baselines
                                else window_json(baselines[pop])))
                undo.append((ROLLOUT_BEFORE_KIND, pop, None if pop not in was.before
                             else window_json(was.before[pop])))

        def done() -> None:
            moved = self.rollout is None or (rollout.wave, rollout.phase) != (
                self.rollout.wave, self.rollout.phase)
            self.rollout, self.failed, self._versions = rollout, failed, dict(kept)
            self._unpublished = None  # what was decided from the rollout before is void
            self._before = baselines
            self._saved = set(needed)
            if moved:
                self._note_wave()
            self._gauges()
            self._changed()

        return records, undo, done

    # -- internals -----------------------------------------------------------------------------

    async def _window(self, now: int, span: int) -> Signals:
        try:
            return await self.source.window(now, span)
        except Exception as err:  # a broken source: no evidence (the gate waits)
            log.warning("metric source failed for the rollout's gates: %s", err)
            return {}

    async def _shed_counts(self, now: int, span: int
                           ) -> Mapping[tuple[str, str, str], tuple[int, int]]:
        """(PoP, group, tier) -> (requests, shed) over (now - span, now]; empty without a
        source of them (the shed readings are then absent: neither pass nor fail)."""
        return {} if self._sheds is None else self._sheds(now, span)

    def _note_wave(self) -> None:
        """The groups with tier actions per PoP when the wave started (onsets count from)."""
        self._actions_at_wave = _active(self.owner.intent.tier_actions)

    def _onsets(self, tier_actions: Mapping[tuple[str, str], TierActions]) -> dict[str, int]:
        now = _active(tier_actions)
        return {pop: len(groups - self._actions_at_wave.get(pop, frozenset()))
                for pop, groups in now.items()}

    def _gauges(self) -> None:
        if self.metrics is None:
            return
        rollout = self.rollout
        self.metrics.set_rollout(None if rollout is None else rollout.phase, PHASES,
                                 0 if rollout is None else rollout.wave,
                                 0 if rollout is None else len(rollout.waves),
                                 self.owner.intent.versions())


def _same_rollout(before: Rollout, after: Rollout) -> bool:
    """Whether `after` goes on from `before` (a look, an action, a renewal: its versions may be
    renewed), not a rollout that started since."""
    return before.started_ms == after.started_ms and before.waves == after.waves


def _read_again(version: Version,
                parse: Callable[[bytes, str], Desired]) -> Version | None:
    """`version`'s bytes read again (`parse`) with the files they name now; None when they no
    longer validate with them."""
    try:
        return Version(parse(version.data, version.desired.source), version.data)
    except DesiredStateError:
        return None


def rollout_draft(event: RolloutEvent) -> Draft:
    """A rollout event as the decision record the one recorder writes."""
    fields = event.record_fields()
    pops = event.pops
    return draft(event.kind, pop=pops[0] if len(pops) == 1 else None, **fields)


def _active(tier_actions: Mapping[tuple[str, str], TierActions]) -> dict[str, frozenset[str]]:
    """PoP -> the groups whose tier actions demote or shed (lending's limits and bounded
    queues alone are capacity bookkeeping, not an incident's onset)."""
    active: dict[str, set[str]] = {}
    for (pop, group), actions in tier_actions.items():
        if actions.shed or (actions.demote_tier and actions.demote_to and actions.demote_share):
            active.setdefault(pop, set()).add(group)
    return {pop: frozenset(groups) for pop, groups in active.items()}


def _windows(signals: Signals, pops: Iterable[str], onsets: Mapping[str, int],
             sheds: Mapping[tuple[str, str, str], tuple[int, int]]) -> tuple[PopWindow, ...]:
    """The signals of `pops` as the gates' windows, with each tier's shed counts."""
    by_pop: dict[str, list[tuple[str, str, Any]]] = {}
    for (pop, group), origins in signals.items():
        for origin, values in origins.items():
            by_pop.setdefault(pop, []).append((group, origin, values))
    tiers: dict[str, list[tuple[str, str, TierShed]]] = {}
    for (pop, group, tier), (requests, shed) in sheds.items():
        if requests > 0:
            tiers.setdefault(pop, []).append((group, tier, TierShed(requests, shed)))
    return tuple(PopWindow(pop, tuple(sorted(by_pop.get(pop, []), key=lambda o: o[:2])),
                           tuple(sorted(tiers.get(pop, []), key=lambda t: t[:2])),
                           onsets.get(pop, 0)) for pop in pops)
