"""`DesiredReload`: a new desired state applied while running — or rejected with the running
state kept.

Parsing and validating run on a worker thread; a valid file starts a rollout (`rollouts.py`:
by the file's `rollout:` policy, or every PoP at once with `--now`) through the change
transaction (`IntentOwner.change`): the carry-over rule over the intent running when the lock
is taken, the per-PoP diffs and the translation of the PoPs that move on a worker thread, the
digest and the rollout's state saved (replicas: by the leader), the `config_applied` record
(with the diff and the PoPs pushed to) and the rollout's records, and the swap. A version that
failed its rollout is not applied again from the same bytes. Anything that fails — a file that
does not parse, too little disk to save the state, a store that refuses the write, a
translation that raises, a swap that fails — is a `config_rejected` record, and what runs stays
as it was. One reload at a time (the file watcher
and SIGHUP share it).

With replicas on etcd only the leader applies a file: a rollout is started, advanced and
superseded by the leader alone, and every replica serves what the leader saved
(`rollouts.follow`). A follower's reload (its file watcher, SIGHUP) validates the file and,
when it differs from the version the replicas serve, records `config_deferred` — valid, left to
the leader, which applies the file it reads — and changes nothing; an invalid one is a
`config_rejected` record as anywhere. When a follower is elected it reads its file again
(`service.py`): a file that differs from what the replicas serve then rolls out like any edit.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from control_plane.decide.rollout import RolloutError
from control_plane.decisions.log import Draft, draft
from control_plane.decisions.recorder import DecisionRecorder
from control_plane.desired import DesiredStateError, parse_desired
from control_plane.desired.model import Desired
from control_plane.desired.warnings import desired_warnings
from control_plane.intent.change import Change, SwapFailed
from control_plane.intent.etcd_store import Deposed, StoreUnavailable, TooLarge
from control_plane.intent.rollout_state import Version
from control_plane.intent.running import RunningIntent
from control_plane.intent.served import translate_intent
from control_plane.own_metrics.registry import BallastMetrics
from control_plane.rollout.rollouts import Rollouts
from control_plane.translate.diff import ResourceChange, diff_renderings, format_changes, summarize
from control_plane.translate.render import render_differing
from control_plane.translate.resources import Capabilities, PopResources
from control_plane.xds_port.server import BallastServer

log = logging.getLogger(__name__)

DIFF_LINES_IN_RECORD = 60
PROBLEMS_IN_RECORD = 50
MIN_FREE_BYTES = 1024 * 1024  # a reload must be able to save the state and record it


class DesiredReload:
    def __init__(
        self,
        path: Path,
        state_dir: Path,
        server: BallastServer,
        recorder: DecisionRecorder,
        metrics: BallastMetrics,
        *,
        follower: Callable[[], str | None] = lambda: None,
        rollouts: Callable[[], Rollouts],
        heap: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
        parse: Callable[[bytes, str], Desired] = parse_desired,
    ) -> None:
        """`parse`: how the file is validated (the service's: its allowed filter types)."""
        self.path = path
        self.state_dir = state_dir
        self.server = server
        self.recorder = recorder
        self.metrics = metrics
        self.follower = follower  # why a replica leaves the file to the leader (None: leads)
        self._rollouts = rollouts  # the rollout driver each new version goes through
        self._parse = parse
        self._heap = heap  # around the apply: `heap.reload_heap` in `ballast serve`
        self.error: str | None = None  # an internal error of the last reload attempt

    def unreadable(self, err: DesiredStateError) -> None:
        """The file cannot be read as a desired state (the watcher's report)."""
        self._reject("unreadable", [str(p) for p in err.problems])

    def failed(self, err: Exception) -> None:
        """An internal error while reloading: rejected, and /readyz says so until the next
        reload works."""
        self.error = f"{type(err).__name__}: {err}"[:300]
        self._reject("internal-error", [f"internal error while reloading: {self.error}"])

    async def apply(self, data: bytes, *, immediate: bool = False, by: str = "file change"
                    ) -> bool:
        """Validate a new desired state and start its rollout (`rollouts.py`: by its
        `rollout:` policy, or on every PoP at once with `immediate`, the operator's `--now`);
        on any problem keep running as is. `by`: who asked, for the records.

        Everything that grows with the desired state (parsing, the per-PoP diffs, translating
        every cached PoP) runs on a worker thread; the loop keeps answering Envoys meanwhile.
        One apply at a time, and none while the rollout driver decides: the driver's one lock
        (a reload starts or supersedes a rollout) covers the whole apply.
        """
        async with self._rollouts().lock:
            try:
                with self._heap():
                    applied = await self._apply(data, immediate, by)
            except Exception as err:  # anything unforeseen: rejected, running state kept
                log.exception("applying %s failed", self.path)
                self.failed(err)
                return False
            self.error = None
            return applied

    async def _apply(self, data: bytes, immediate: bool, by: str) -> bool:
        source = str(self.path)
        digest = hashlib.sha256(data).hexdigest()
        try:
            new = await asyncio.to_thread(self._parse, data, source)
        except DesiredStateError as err:
            self._reject(digest, [str(p) for p in err.problems])
            return False
        owner = self.server.intent
        if new.digest == owner.desired.digest:
            return False
        follower = self.follower()
        if follower is not None:  # the leader applies the file it reads; this one serves its
            self._defer(new, follower, by)
            return False
        rollouts = self._rollouts()
        failed = rollouts.refused(new.digest)
        if failed is not None and not immediate:  # the same bytes fail the same way
            self._reject(digest, [f"{source}: version {new.digest[:16]} failed its rollout "
                                  f"({failed}); not applied again: save a fixed file (new "
                                  "bytes start a new rollout) or apply it with --now"])
            return False
        free = _free_bytes(self.state_dir)
        if free < MIN_FREE_BYTES:  # a full disk rejects the apply: nothing half-done
            self._reject(digest, [f"{source}: only {free:,} bytes free where the state is saved "
                                  f"({self.state_dir}); not applied"])
            return False
        try:
            # saved before it applies (replicas: by the leader; the others follow etcd); one
            # rollout at a time (under the driver's lock, `apply`): started, or superseding the
            # one in progress, here
            async with owner.change() as change:
                begun = await rollouts.begin(change, Version(new, data),
                                             immediate=immediate, by=by)
                served = _served(change, owner.intent)  # as the build reads the cache
                await change.prepare()
                diffs = pop_diffs(change.over, change.target, served,
                                  _served(change, change.target, built=True))
                changes = await asyncio.to_thread(diffs)
                change.record(lambda pushed: [_applied_record(new, changes, pushed, by)])
                change.record(begun.records)
            begun.done()
        except (RolloutError, Deposed) as err:  # the lead lost since the check: the new
            self._defer(new, str(err), by)       # leader applies the file it reads
            return False
        except (OSError, sqlite3.Error, StoreUnavailable, TooLarge) as err:
            log.error("cannot save the desired state's digest: %s", err)
            self._reject(digest, [f"{source}: cannot save the state ({err}); not applied"])
            return False
        except SwapFailed as err:
            log.error("cannot publish %s: %s", source, err)
            self._reject(digest, [f"{source}: cannot publish ({err}); not applied"])
            return False
        except Exception as err:  # translation of a valid file failed: never half-apply
            log.exception("applying %s failed", source)
            self._reject(digest, [f"{source}: cannot translate: {err}"])
            return False
        log_warnings(new)
        self.metrics.config_reloads.labels("applied").inc()
        log.info("applied %s: %s", source, "; ".join(
            f"pop {pop}: {summarize(c)}" for pop, c in sorted(changes.items())))
        return True

    def _defer(self, new: Desired, why: str, by: str) -> None:
        """A valid file a follower leaves to the leader: recorded, nothing changed."""
        self.recorder.record(
            "config_deferred",
            config_version=new.digest[:16],
            rule=f"desired state {new.source} (version {new.digest[:16]}, {by}) is valid; not "
            f"applied here: {why}. The leader applies the file it reads: keep the file the "
            "same on every replica (this one applies its file if it is elected)",
            detail={"digest": new.digest, "by": by, "why": why,
                    "serving": self.server.intent.desired.digest},
        )
        log.info("%s: valid, left to the leader: %s", new.source, why)

    def _reject(self, digest: str, problems: list[str]) -> None:
        self.recorder.record(
            "config_rejected",
            config_version=digest[:16],
            rule=f"desired state rejected ({len(problems)} problems); running state kept",
            detail={"problems": problems[:PROBLEMS_IN_RECORD], "problem_count": len(problems)},
        )
        self.metrics.config_reloads.labels("rejected").inc()
        log.error("rejected new desired state, keeping the running one:\n%s", "\n".join(problems))


def log_warnings(desired: Desired) -> None:
    """What `ballast validate` warns about, in the server log too (e.g. TLS verification off)."""
    for warning in desired_warnings(desired):
        log.warning("%s: %s", desired.source, warning)


def _applied_record(new: Desired, changes: dict[str, list[ResourceChange]],
                    pushed: frozenset[str], by: str) -> Draft:
    """The `config_applied` record of a reload: who asked (`by`), per PoP what changes, the
    PoPs pushed to."""
    lines = [f"pop {pop}: {summarize(c)}" for pop, c in sorted(changes.items())]
    diff = [line for pop, c in sorted(changes.items())
            for line in [f"pop {pop}:", *format_changes(c)]]
    return draft(
        "config_applied",
        config_version=new.digest[:16],
        rule=f"desired state applied ({'; '.join(lines)}); pushed to "
        f"{', '.join(sorted(pushed)) or 'no PoP'} ({by})",
        detail={"digest": new.digest, "pushed_pops": sorted(pushed), "by": by,
                "diff": diff[:DIFF_LINES_IN_RECORD], "diff_lines": len(diff),
                "warnings": desired_warnings(new)},
    )


def _free_bytes(directory: Path) -> int:
    status = os.statvfs(directory)
    return status.f_bavail * status.f_frsize


def _pops(old: RunningIntent, new: RunningIntent) -> list[str]:
    return sorted(set(old.pop_names) | set(new.pop_names))


def _served(change: Change, intent: RunningIntent, *, built: bool = False
            ) -> dict[str, PopResources | None]:
    """What each PoP's Envoys without adaptive LIFO are served now (`built`: once the change
    is published, where it built that), where it was built."""
    caps = Capabilities()
    if built:
        return {pop: change.built(pop, caps) for pop in intent.pop_names}
    return {pop: change.served(pop, caps) for pop in intent.pop_names}


def pop_diffs(
    before: RunningIntent, after: RunningIntent, served: dict[str, PopResources | None],
    built: dict[str, PopResources | None],
) -> Callable[[], dict[str, list[ResourceChange]]]:
    """A call that computes, per PoP, what it gets differently under the carried-over intent
    `after` than under `before` (Envoys without adaptive LIFO), touching nothing served (a
    worker thread may run it). `served`: what is served now; `built`: what the change built
    (the same bytes a full translation gives, made incrementally), used where it holds the
    PoP; others are translated."""

    def diffs() -> dict[str, list[ResourceChange]]:
        return {pop: diff_pop(before, after, pop, served.get(pop), built.get(pop))
                for pop in _pops(before, after)}

    return diffs


def diff_pop(
    before: RunningIntent, after: RunningIntent, pop: str,
    before_resources: PopResources | None = None, after_resources: PopResources | None = None,
) -> list[ResourceChange]:
    """What `pop` gets differently under `after` than under `before` (Envoys without adaptive
    LIFO): exactly what applying `after` pushes to them. `before_resources`/`after_resources`:
    its resources under each, when at hand (else translated). Only resources whose bytes
    differ are rendered."""
    caps = Capabilities()
    old = None if pop not in before.pop_names else (
        before_resources or translate_intent(before, pop, caps))
    new = None if pop not in after.pop_names else (
        after_resources or translate_intent(after, pop, caps))
    return diff_renderings(*render_differing(old, new))
