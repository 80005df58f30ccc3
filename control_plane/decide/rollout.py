"""A rollout: how a new desired-state version reaches the PoPs, wave by wave. Pure.

A **version** is a desired state's digest. A rollout takes the PoPs from `from_version` (the
last version that passed) to `to_version` in **waves** (`plan_waves`): the canary PoPs, then
growing shares of the others. The PoPs of the waves reached so far serve `to_version`; every
other PoP keeps serving `from_version` (`version_of`). Each wave **bakes** for the policy's bake
time; then, when its **gate** passes (`decide/gates.py`: ACKs, no NACK, no regression), the next
wave starts, and after the last one the rollout has **passed**. A failing gate, in any phase
but a terminal one, **rolls back**: every PoP serves `from_version` again, and `to_version` is
the failed version (`failed_version`) that the watcher does not apply again.

Phases: `baking` (a wave serves and is judged), `paused` (by the operator, or by the gates when
a wave found no evidence for `evidence_timeout` after its bake: no wave starts; a failing gate
still rolls back), and the terminal `passed`, `rolled_back`, `aborted` (the operator's
rollback), `superseded` (a newer version's rollout replaced it).

Operator actions: `pause`, `resume` (the wave bakes again from the resume: the gates judge a
fresh bake), `abort` (roll back now), `promote` (every PoP on `to_version` now, recorded).
`start(..., immediate=True)` (`--now`) or `strategy: immediate` puts every PoP on the new
version at once, no bake and no gate, and says so.

A new version while a rollout is in progress (`supersede`): the old rollout ends `superseded`
and the new version rolls out from the old one's `from_version` (the last version that passed,
never the superseded one that did not pass): the PoPs that served the superseded version go
back to the last passed version, except those in the new rollout's first wave, which get the
new version. A new version equal to the last passed one ends the rollout with every PoP on it
(a revert); the same version as the one rolling out changes nothing.

**Certificate renewals** (`renewal`: a new version that differs from the one it rolls out from
only in the contents of certificates its TLS listeners already serve, for the same hostnames)
follow the policy's `renewals`: `immediate` (the default) puts every PoP on the renewed version
at once after validation (`start`), `waves` rolls it out like any change. A renewal arriving
while a rollout is in progress does not supersede it (`renew`): the rollout goes on in the wave
it is in, its bake not restarted (N renewals within a bake do not restart the canary N times);
the PoPs it reached get the version rolling out with the renewed certificates and, with
`immediate`, the others get the last passed version with them. Certificates renewed while
Ballast was down (`rebase`: the stored versions read again name other files' contents) are
served at the restart, whatever the policy: the old files are gone.

For the faces and the shell: `timeline` (each wave's PoPs, state and start), `serving_since`
(when a PoP got the new version: where its own window before the change ends).

Every transition returns `RolloutEvent`s, the decision records the shell writes (kinds in
`ROLLOUT_KINDS`). A look's event carries the rollout before it, the time and the gate's result,
so `replay_look` recomputes it from the record alone. A look records a `gate_reading` when the
gate's verdict changes (a bake's readings are recorded as they turn, not every look).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from control_plane.decide.gates import GateInputs, GateResult, evaluate
from control_plane.desired.model import Desired, RolloutPolicy

Phase = Literal["baking", "paused", "passed", "rolled_back", "aborted", "superseded"]
PHASES: tuple[str, ...] = ("baking", "paused", "passed", "rolled_back", "aborted", "superseded")
IN_PROGRESS: frozenset[str] = frozenset({"baking", "paused"})
ROLLOUT_KINDS: tuple[str, ...] = (
    "rollout_started",
    "wave_started",
    "gate_reading",
    "wave_passed",
    "rollout_passed",
    "rolled_back",
    "rollout_paused",
    "rollout_resumed",
    "rollout_aborted",
    "rollout_promoted",
    "rollout_superseded",
    "certificates_renewed",
)
NEXT_STEP_AFTER_ROLLBACK = (
    "fix the desired state and save it: a new version starts a new rollout (these bytes are "
    "not applied again); `ballast explain` shows this record")
MAX_POPS = 10_000  # a stored rollout naming more PoPs is refused as corrupt
MAX_REASON_CHARS = 2000
MAX_VERSION_CHARS = 128


class RolloutError(ValueError):
    """An operator action that does not apply to the rollout's phase (nothing is changed)."""


@dataclass(frozen=True)
class Rollout:
    """One version's way to the PoPs (see the module docstring)."""

    from_version: str  # the last version that passed: what PoPs not yet reached serve
    to_version: str
    waves: tuple[tuple[str, ...], ...]  # PoP names, wave by wave
    wave: int  # index of the wave baking now (waves[:wave + 1] serve to_version)
    phase: Phase
    started_ms: int
    wave_started_ms: int  # when the current wave started (or was resumed)
    immediate: bool = False  # every PoP at once (--now or strategy: immediate)
    reason: str = ""  # why the phase, in words
    gate: GateResult | None = None  # the last gate result of the current wave
    updated_ms: int = 0  # when the phase or wave last changed
    wave_starts: tuple[int, ...] = ()  # when each wave reached so far first started
    promoted: bool = False  # passed by the operator's promote, not by the gates

    @property
    def in_progress(self) -> bool:
        return self.phase in IN_PROGRESS

    @property
    def pops(self) -> tuple[str, ...]:
        return tuple(pop for wave in self.waves for pop in wave)

    def to_dict(self) -> dict[str, Any]:
        return {
            "from_version": self.from_version,
            "to_version": self.to_version,
            "waves": [list(wave) for wave in self.waves],
            "wave": self.wave,
            "phase": self.phase,
            "started_ms": self.started_ms,
            "wave_started_ms": self.wave_started_ms,
            "immediate": self.immediate,
            "reason": self.reason,
            "gate": None if self.gate is None else self.gate.to_dict(),
            "updated_ms": self.updated_ms,
            "wave_starts": list(self.wave_starts),
            "promoted": self.promoted,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rollout:
        """The rollout as `to_dict` wrote it; ValueError (or KeyError/TypeError) when it is not
        one."""
        phase = str(data["phase"])
        if phase not in PHASES:
            raise ValueError(f"unknown rollout phase {phase!r}")
        waves = tuple(tuple(str(pop) for pop in wave) for wave in data["waves"])
        if not waves or any(not wave for wave in waves):
            raise ValueError("a rollout has at least one wave, none empty")
        pops = [pop for wave in waves for pop in wave]
        if len(pops) > MAX_POPS or len(set(pops)) != len(pops):
            raise ValueError(f"a rollout names each PoP once, at most {MAX_POPS}")
        wave = int(data["wave"])
        if not 0 <= wave < len(waves):
            raise ValueError(f"wave {wave} out of range 0..{len(waves) - 1}")
        gate = data.get("gate")
        starts = tuple(int(at) for at in data.get("wave_starts", ()))
        if len(starts) > wave + 1:
            raise ValueError(f"{len(starts)} wave starts for {wave + 1} wave(s) reached")
        versions = str(data["from_version"]), str(data["to_version"])
        if any(not 0 < len(version) <= MAX_VERSION_CHARS for version in versions):
            raise ValueError(f"a version is a digest of 1 to {MAX_VERSION_CHARS} characters")
        return cls(
            from_version=versions[0],
            to_version=versions[1],
            waves=waves,
            wave=wave,
            phase=phase,  # type: ignore[arg-type]
            started_ms=int(data["started_ms"]),
            wave_started_ms=int(data["wave_started_ms"]),
            immediate=bool(data.get("immediate", False)),
            reason=str(data.get("reason", ""))[:MAX_REASON_CHARS],
            gate=None if gate is None else GateResult.from_dict(gate),
            updated_ms=int(data.get("updated_ms", 0)),
            wave_starts=starts,
            promoted=bool(data.get("promoted", False)),
        )


@dataclass(frozen=True)
class RolloutEvent:
    """A decision record of a rollout: `kind` (one of ROLLOUT_KINDS), the rule in words, the
    PoPs it concerns and JSON-ready details."""

    kind: str
    rule: str
    version: str  # the version rolling out
    pops: tuple[str, ...] = ()
    detail: Mapping[str, Any] | None = None

    def record_fields(self) -> dict[str, Any]:
        """Fields for ``recorder.record(event.kind, **these)``."""
        return {"rule": self.rule, "config_version": self.version[:16],
                "detail": {"pops": list(self.pops), **(self.detail or {})}}


def plan_waves(policy: RolloutPolicy, pops: Sequence[str], old_pops: Sequence[str] = ()
               ) -> tuple[tuple[str, ...], ...]:
    """The waves for the PoPs of the new version (`pops`, in file order) coming from a version
    with `old_pops`: the canary (policy's, else the first PoP) with the PoPs the new version
    adds (they serve nobody yet), then the others by the policy's cumulative percents (rounded
    up), the PoPs the new version removes in the last wave (they keep the old config until the
    change has proven itself). Empty waves are left out; `immediate`: one wave."""
    removed = tuple(pop for pop in old_pops if pop not in pops)
    every = (*pops, *removed)
    if not every:
        return ()
    if policy.strategy == "immediate":
        return (every,)
    canary = tuple(pop for pop in pops if pop in policy.canary) or pops[:1]
    old = set(old_pops)
    added = tuple(pop for pop in pops if old and pop not in old and pop not in canary)
    first = (*canary, *added)
    rest = [pop for pop in pops if pop not in first]
    waves: list[tuple[str, ...]] = [first] if first else []
    covered = 0
    for percent in policy.waves:
        upto = math.ceil(len(rest) * percent / 100)
        if upto > covered:
            waves.append(tuple(rest[covered:upto]))
            covered = upto
    if removed and len(waves) > 1:
        waves[-1] = (*waves[-1], *removed)
    elif removed:
        waves.append(removed)
    return tuple(waves)


def reached(rollout: Rollout) -> frozenset[str]:
    """The PoPs serving `to_version` now."""
    if rollout.phase == "passed":
        return frozenset(rollout.pops)
    if rollout.phase in IN_PROGRESS:
        return frozenset(pop for wave in rollout.waves[:rollout.wave + 1] for pop in wave)
    return frozenset()


def version_of(rollout: Rollout, pop: str) -> str:
    """The version `pop` serves: `to_version` once its wave was reached (and after a pass),
    `from_version` before, and after a rollback, an abort or a supersede."""
    return rollout.to_version if pop in reached(rollout) else rollout.from_version


def serving_since(rollout: Rollout, pop: str) -> int | None:
    """When `pop` started serving `to_version` (its wave's first start; the start of the
    rollout for an immediate one or a promote's skipped waves), None when it does not serve it:
    where the PoP's own window before the change ends."""
    if pop not in reached(rollout):
        return None
    index = next(i for i, wave in enumerate(rollout.waves) if pop in wave)
    if index < len(rollout.wave_starts):
        return rollout.wave_starts[index]
    return rollout.updated_ms if rollout.promoted else rollout.started_ms


WaveState = Literal["passed", "baking", "paused", "pending", "promoted", "rolled_back",
                    "aborted", "superseded"]


def timeline(rollout: Rollout) -> list[dict[str, Any]]:
    """Each wave: its PoPs, its state and when it started (None: not yet); JSON-ready, for
    the faces (status, dashboard)."""
    waves = []
    for index, pops in enumerate(rollout.waves):
        state: WaveState
        if rollout.phase == "passed":
            state = "promoted" if rollout.promoted and index >= rollout.wave else "passed"
        elif index < rollout.wave:
            state = "passed"
        elif index > rollout.wave:
            state = "pending"
        else:
            state = rollout.phase
        started = rollout.wave_starts[index] if index < len(rollout.wave_starts) else None
        if started is None and state == "promoted":
            started = rollout.updated_ms
        waves.append({"wave": index + 1, "pops": list(pops), "state": state,
                      "started_ms": started})
    return waves


def last_passed(rollout: Rollout) -> str:
    """The last version that passed: the one a new version rolls out from."""
    return rollout.to_version if rollout.phase == "passed" else rollout.from_version


def failed_version(rollout: Rollout) -> str | None:
    """The version a rollback or an abort refused: not applied again from the same bytes."""
    return rollout.to_version if rollout.phase in ("rolled_back", "aborted") else None


def start(policy: RolloutPolicy, from_version: str, to_version: str, pops: Sequence[str],
          old_pops: Sequence[str], now_ms: int, *, immediate: bool = False, by: str = "",
          renewed: Sequence[str] = ()) -> tuple[Rollout, tuple[RolloutEvent, ...]]:
    """A rollout of `to_version` (PoPs `pops`) from `from_version` (PoPs `old_pops`); `by`
    names who asked (e.g. "file change", "operator --now"); `renewed`: the certificates (SDS
    secret names) it renews when that is all it changes (`renewal`)."""
    waves = plan_waves(policy, pops, old_pops)
    if to_version == from_version:
        why = "it is the last version that passed: every PoP serves it at once"
    elif immediate:
        why = "immediate apply (--now): every PoP at once, no bake, no gate"
    elif policy.strategy == "immediate":
        why = "rollout strategy immediate: every PoP at once, no bake, no gate"
    elif renewed and policy.renewals == "immediate":
        why = (f"a renewal of certificate(s) {', '.join(renewed)} for hostnames already served "
               "(nothing else changes): every PoP at once after validation (rollout.renewals: "
               "immediate)")
    else:
        why = ""
    now_all = bool(why)
    if now_all:
        waves = (tuple(pop for wave in waves for pop in wave),)
        immediate = to_version != from_version
    who = f" ({by})" if by else ""
    rollout = Rollout(from_version, to_version, waves, 0, "passed" if now_all else "baking",
                      now_ms, now_ms, immediate=immediate,
                      reason=why or f"wave 1 of {len(waves)} baking", updated_ms=now_ms,
                      wave_starts=(now_ms,))
    started = RolloutEvent(
        "rollout_started",
        f"rollout of {to_version[:16]} from {from_version[:16]}{who}: "
        + (why or " -> ".join(f"[{', '.join(w)}]" for w in waves)
           + f", each baked {policy.bake_ms / 1000:g} s"),
        to_version, rollout.pops,
        {"from_version": from_version, "waves": [list(w) for w in waves],
         "immediate": rollout.immediate, "by": by, "bake_ms": policy.bake_ms,
         **({"renewed": list(renewed)} if renewed else {})})
    if now_all:
        passed = RolloutEvent("rollout_passed", f"{to_version[:16]} on every PoP: {why}",
                              to_version, rollout.pops, {"immediate": rollout.immediate})
        return rollout, (started, passed)
    return rollout, (started, _wave_started(rollout, policy))


def _wave_started(rollout: Rollout, policy: RolloutPolicy) -> RolloutEvent:
    wave = rollout.waves[rollout.wave]
    return RolloutEvent(
        "wave_started",
        f"wave {rollout.wave + 1} of {len(rollout.waves)} gets {rollout.to_version[:16]}: "
        f"{', '.join(wave)}; bakes {policy.bake_ms / 1000:g} s",
        rollout.to_version, wave, {"wave": rollout.wave, "bake_ms": policy.bake_ms})


def look(rollout: Rollout, inputs: GateInputs, now_ms: int, policy: RolloutPolicy
         ) -> tuple[Rollout, tuple[RolloutEvent, ...]]:
    """One look at a rollout in progress: its gate judged on `inputs`, then `advance`."""
    if not rollout.in_progress:
        return rollout, ()
    gate = evaluate(inputs, reached(rollout), rollout.to_version, rollout.wave_started_ms,
                    now_ms, policy.gates)
    return advance(rollout, gate, now_ms, policy)


def advance(rollout: Rollout, gate: GateResult, now_ms: int, policy: RolloutPolicy
            ) -> tuple[Rollout, tuple[RolloutEvent, ...]]:
    """What the gate's result means for the rollout at `now_ms`: roll back on `fail`; after
    the bake, the next wave (or passed) on `pass`; a pause when a wave still waits for evidence
    `evidence_timeout` after its bake; otherwise the same phase with the reading kept."""
    if not rollout.in_progress:
        return rollout, ()
    replay = {"before": rollout.to_dict(), "now_ms": now_ms, "gate": gate.to_dict()}
    baked = now_ms - rollout.wave_started_ms >= policy.bake_ms
    version = rollout.to_version
    if gate.verdict == "fail":
        got = sorted(reached(rollout))
        why = "; ".join(gate.why)
        after = replace(rollout, phase="rolled_back", gate=gate, updated_ms=now_ms,
                        reason=f"gate failed in wave {rollout.wave + 1}: {why}")
        return after, (
            RolloutEvent("gate_reading", f"wave {rollout.wave + 1}: gate failed: {why}", version,
                         rollout.waves[rollout.wave], replay),
            RolloutEvent(
                "rolled_back",
                f"rolled back {version[:16]} to {rollout.from_version[:16]} in "
                f"{', '.join(got)}: {why}; next: {NEXT_STEP_AFTER_ROLLBACK}",
                version, tuple(got),
                {"from_version": rollout.from_version, "failed_version": version,
                 "why": list(gate.why), "wave": rollout.wave, "next": NEXT_STEP_AFTER_ROLLBACK,
                 "failing": [r.to_dict() for r in gate.readings if r.verdict == "fail"]}),
        )
    changed = rollout.gate is None or rollout.gate.verdict != gate.verdict
    reading = RolloutEvent(
        "gate_reading", f"wave {rollout.wave + 1}: gate {_verdict_words(gate)}: "
        f"{'; '.join(gate.why)}", version, rollout.waves[rollout.wave], replay)
    if rollout.phase == "paused":
        return replace(rollout, gate=gate), (reading,) if changed else ()
    if gate.verdict == "pass" and baked:
        passed = RolloutEvent(
            "wave_passed",
            f"wave {rollout.wave + 1} of {len(rollout.waves)} passed after "
            f"{(now_ms - rollout.wave_started_ms) / 1000:g} s: {'; '.join(gate.why)}",
            version, rollout.waves[rollout.wave], replay)
        if rollout.wave + 1 == len(rollout.waves):
            after = replace(rollout, phase="passed", gate=gate, updated_ms=now_ms,
                            reason=f"every wave passed its gate ({len(rollout.waves)})")
            return after, (passed, RolloutEvent(
                "rollout_passed", f"{version[:16]} passed on every PoP "
                f"({len(rollout.pops)} in {len(rollout.waves)} waves)", version, rollout.pops,
                {"from_version": rollout.from_version}))
        after = replace(rollout, wave=rollout.wave + 1, wave_started_ms=now_ms, gate=None,
                        updated_ms=now_ms, wave_starts=(*rollout.wave_starts, now_ms),
                        reason=f"wave {rollout.wave + 2} of {len(rollout.waves)} baking")
        return after, (passed, _wave_started(after, policy))
    overdue = now_ms - rollout.wave_started_ms - policy.bake_ms
    if gate.verdict == "wait" and overdue >= policy.gates.evidence_timeout_ms:
        reason = (f"wave {rollout.wave + 1} found no verdict "
                  f"{policy.gates.evidence_timeout_ms / 1000:g} s after its bake: "
                  f"{'; '.join(gate.why)}; resume to wait again, promote or abort")
        after = replace(rollout, phase="paused", gate=gate, updated_ms=now_ms, reason=reason)
        return after, (
            RolloutEvent("rollout_paused", f"paused by the gates: {reason}", version,
                         rollout.waves[rollout.wave], {"by": "gates", **replay}),
        )
    return replace(rollout, gate=gate), (reading,) if changed else ()


def _verdict_words(gate: GateResult) -> str:
    return {"pass": "passes", "fail": "failed", "wait": "waits"}[gate.verdict]


def replay_look(detail: Mapping[str, Any], policy: RolloutPolicy
                ) -> tuple[Rollout, tuple[RolloutEvent, ...]]:
    """The look a `gate_reading`, `wave_passed` or gates' `rollout_paused` record's detail
    describes (the rollout before it, the time, the gate's result), computed again."""
    return advance(Rollout.from_dict(detail["before"]), GateResult.from_dict(detail["gate"]),
                   int(detail["now_ms"]), policy)


def _operator(rollout: Rollout, action: str) -> None:
    if not rollout.in_progress:
        raise RolloutError(f"cannot {action}: the rollout of {rollout.to_version[:16]} is "
                           f"{rollout.phase.replace('_', ' ')}, not in progress")


def _who(by: str) -> str:
    return f" by {by}" if by else ""


def pause(rollout: Rollout, now_ms: int, by: str = "") -> tuple[Rollout, tuple[RolloutEvent, ...]]:
    """No further wave starts until `resume`; the gate still rolls back on a failure."""
    _operator(rollout, "pause")
    if rollout.phase == "paused":
        raise RolloutError(f"cannot pause: the rollout of {rollout.to_version[:16]} is paused "
                           "already")
    reason = f"paused{_who(by)} in wave {rollout.wave + 1} of {len(rollout.waves)}"
    after = replace(rollout, phase="paused", reason=reason, updated_ms=now_ms)
    return after, (RolloutEvent("rollout_paused", reason, rollout.to_version,
                                rollout.waves[rollout.wave], {"by": by}),)


def resume(rollout: Rollout, now_ms: int, by: str = ""
           ) -> tuple[Rollout, tuple[RolloutEvent, ...]]:
    """The current wave bakes again from now (the gates judge a fresh bake)."""
    _operator(rollout, "resume")
    if rollout.phase != "paused":
        raise RolloutError(f"cannot resume: the rollout of {rollout.to_version[:16]} is not "
                           "paused")
    reason = (f"resumed{_who(by)}: wave {rollout.wave + 1} of {len(rollout.waves)} bakes "
              "again from now")
    after = replace(rollout, phase="baking", wave_started_ms=now_ms, reason=reason, gate=None,
                    updated_ms=now_ms)
    return after, (RolloutEvent("rollout_resumed", reason, rollout.to_version,
                                rollout.waves[rollout.wave], {"by": by}),)


def abort(rollout: Rollout, now_ms: int, by: str = "") -> tuple[Rollout, tuple[RolloutEvent, ...]]:
    """Every PoP back on `from_version` now; `to_version` is not applied again."""
    _operator(rollout, "abort")
    got = sorted(reached(rollout))
    reason = (f"aborted{_who(by)} in wave {rollout.wave + 1}: {', '.join(got)} back on "
              f"{rollout.from_version[:16]}")
    after = replace(rollout, phase="aborted", reason=reason, updated_ms=now_ms)
    return after, (RolloutEvent("rollout_aborted", f"{reason}; next: {NEXT_STEP_AFTER_ROLLBACK}",
                                rollout.to_version, tuple(got),
                                {"by": by, "from_version": rollout.from_version,
                                 "failed_version": rollout.to_version}),)


def promote(rollout: Rollout, now_ms: int, by: str = ""
            ) -> tuple[Rollout, tuple[RolloutEvent, ...]]:
    """Every PoP on `to_version` now, the remaining waves and gates skipped (recorded)."""
    _operator(rollout, "promote")
    rest = sorted(set(rollout.pops) - reached(rollout))
    reason = (f"promoted{_who(by)} in wave {rollout.wave + 1} of {len(rollout.waves)}: "
              f"{', '.join(rest) or 'no PoP'} get {rollout.to_version[:16]} without their waves")
    after = replace(rollout, phase="passed", reason=reason, updated_ms=now_ms, promoted=True)
    return after, (RolloutEvent("rollout_promoted", reason, rollout.to_version, tuple(rest),
                                {"by": by, "skipped_waves": rollout.waves[rollout.wave + 1:]}),)


def supersede(old: Rollout, policy: RolloutPolicy, to_version: str, pops: Sequence[str],
              old_pops: Sequence[str], now_ms: int, *, immediate: bool = False, by: str = "",
              renewed: Sequence[str] = ()
              ) -> tuple[Rollout, Rollout, tuple[RolloutEvent, ...]]:
    """A new version arriving while `old` may be in progress: (old as it ends, the new
    rollout, the events). `old_pops`: the PoPs of `last_passed(old)`, what the new rollout
    starts from (see the module docstring)."""
    if to_version == old.to_version and old.in_progress:
        return old, old, ()
    events: list[RolloutEvent] = []
    ended = old
    if old.in_progress:
        back = sorted(reached(old))
        ended = replace(old, phase="superseded", updated_ms=now_ms,
                        reason=f"superseded by {to_version[:16]}")
        events.append(RolloutEvent(
            "rollout_superseded",
            f"{old.to_version[:16]} superseded by {to_version[:16]} in wave {old.wave + 1}: the "
            f"new version rolls out from the last passed {old.from_version[:16]}"
            + (f"; {', '.join(back)} leave {old.to_version[:16]}" if back else ""),
            old.to_version, tuple(back), {"by": by, "superseded_by": to_version}))
    new, started = start(policy, last_passed(old), to_version, pops, old_pops, now_ms,
                         immediate=immediate, by=by, renewed=renewed)
    return ended, new, (*events, *started)


def renewal(old: Desired, new: Desired) -> tuple[str, ...]:
    """The certificates (SDS secret names) `new` renews when that is all that differs from
    `old`: every listener, hostname and setting the same (a TLS listener's `shape`), only the
    contents of some certificates and keys served for the same hostnames new (renewed files, or
    other files). () when anything else differs (a hostname added or moved, a client CA, any
    other field: a change like any other), or no certificate does."""
    pairs = [(a, b) for x, y in zip(old.listeners, new.listeners, strict=False)
             if x.tls is not None and y.tls is not None
             for a, b in zip(x.tls.certificates, y.tls.certificates, strict=False)]
    renewed = tuple(b.secret_name for a, b in pairs
                    if (a.fingerprint, a.key_fingerprint) != (b.fingerprint, b.key_fingerprint))
    if not renewed or _shape(old) != _shape(new):
        return ()
    return renewed


def _shape(desired: Desired) -> Desired:
    """`desired` without what a renewal changes: its certificates' contents, its digest and
    where it was read from."""
    return replace(desired, listeners=tuple(listener.shape for listener in desired.listeners),
                   digest="", source="")


def renew(rollout: Rollout, policy: RolloutPolicy, to_version: str, renewed_from: str | None,
          renewed: Sequence[str], now_ms: int, by: str = ""
          ) -> tuple[Rollout, tuple[RolloutEvent, ...]]:
    """A renewal (`renewal`) of the version `rollout` (in progress) rolls out: the rollout goes
    on where it is, its wave baking since it started (a renewal does not restart the canary).
    The PoPs it reached get `to_version` (the version rolling out, renewed); the others get
    `renewed_from` (the last passed version read again with the renewed files; None: it could
    not be) when the policy sends renewals at once, else they keep what they serve until their
    wave."""
    if not rollout.in_progress:
        raise RolloutError(f"the rollout of {rollout.to_version[:16]} is not in progress")
    at_once = policy.renewals == "immediate" and renewed_from not in (None,
                                                                       rollout.from_version)
    from_version = renewed_from if at_once and renewed_from is not None \
        else rollout.from_version
    after = replace(rollout, from_version=from_version, to_version=to_version,
                    updated_ms=now_ms)
    if from_version == to_version:  # the two versions read the same files now: nothing left
        after = replace(after, phase="passed", promoted=True,
                        reason=f"certificate(s) {', '.join(renewed)} renewed: the version rolling "
                        "out and the last passed one are the same with them; every PoP serves "
                        "it")
    got = [pop for pop in rollout.pops if pop in reached(rollout)]  # in wave order
    others = [pop for pop in rollout.pops if pop not in got]
    if not others:
        rest = ""
    elif renewed_from == rollout.from_version:
        rest = f"; {', '.join(others)} serve none of them"
    elif at_once:
        rest = (f"; {', '.join(others)} get {from_version[:16]} (the last passed version with "
                "them) now: rollout.renewals immediate")
    elif policy.renewals == "immediate":
        rest = (f"; {', '.join(others)} keep {rollout.from_version[:16]} until their wave: the "
                "last passed version does not read with the renewed files")
    else:
        rest = f"; {', '.join(others)} get them with their wave: rollout.renewals waves"
    who = f" ({by})" if by else ""
    event = RolloutEvent(
        "certificates_renewed",
        f"certificate(s) {', '.join(renewed)} renewed{who} during the rollout of "
        f"{rollout.to_version[:16]}: it goes on in wave {rollout.wave + 1} of "
        f"{len(rollout.waves)}, {rollout.phase.replace('_', ' ')} as before (its bake not "
        f"restarted); {', '.join(got)} get {to_version[:16]}{rest}",
        to_version, tuple(got) if not at_once else rollout.pops,
        {"renewed": list(renewed), "by": by, "wave": rollout.wave,
         "from_version": {"before": rollout.from_version, "after": from_version},
         "to_version": {"before": rollout.to_version, "after": to_version},
         "renewals": policy.renewals})
    return after, (event,)


def rebase(rollout: Rollout, renamed: Mapping[str, str], now_ms: int) -> Rollout:
    """`rollout` with its versions renamed (`renamed`: old digest -> new): the stored versions
    read again with the certificate files on disk now (renewed while Ballast was down). A
    rollout in progress whose two versions became one has nothing left to roll out: every PoP
    serves it (passed, its remaining waves skipped, and the reason says why)."""
    from_version = renamed.get(rollout.from_version, rollout.from_version)
    to_version = renamed.get(rollout.to_version, rollout.to_version)
    if (from_version, to_version) == (rollout.from_version, rollout.to_version):
        return rollout
    after = replace(rollout, from_version=from_version, to_version=to_version)
    if from_version != to_version or not rollout.in_progress:
        return after
    return replace(after, phase="passed", promoted=True, updated_ms=now_ms,
                   reason=f"certificates renewed while Ballast was down: the version rolling "
                   f"out and the last passed one read the same files now ({to_version[:16]}); "
                   "every PoP serves it")
