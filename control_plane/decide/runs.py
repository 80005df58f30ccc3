"""Runs of quiet ticks of one (PoP, origin group): what the decision log writes for them. Pure.

A (PoP, group) that keeps holding (no metrics yet, a sick origin held at its target, waiting to
return) or stays steady decides the same thing every tick. The log gets one record when such a
run starts (the tick's own `hold`/`steady` record, replayable like any other) and one when it
ends (`hold_ended`/`steady_ended`, with the number of ticks and the last tick's rule), never one
per tick: with 100 PoPs x 50 groups and no metrics, the log grows by 5,000 records once, not by
5,000 per tick.

A run is identified by the step's kind and its `reason` (``fail_static``, ``no_evidence``,
``sick_held``, ``nowhere_better``, ``return_wait``, ``steady``) and whether silent nodes are its
cause: a hold that changes its reason ends one run and starts another (so every run of "nowhere
better" holds starts with a record of its scores, and the first silent node is named by a record
at once). Which nodes are silent does not make a new run: in a fleet whose nodes come and go
(the soak bench: 1,000 nodes churning) the set changes every few seconds, and a run per change
wrote about 10 `hold` and 10 `hold_ended` records a second until the log rotated away what it
held. `ballast status` and `explain` name the nodes silent now; the run's first record, those
at its start.
The run a process finds at its first tick when it is steady is not logged (nothing happened),
so its end is not logged either.
"""

from __future__ import annotations

from dataclasses import dataclass

from control_plane.decide.controller import StepResult

QUIET_KINDS: tuple[str, ...] = ("hold", "steady")
END_KINDS: dict[str, str] = {"hold": "hold_ended", "steady": "steady_ended"}


@dataclass(frozen=True)
class QuietRun:
    """A run of ticks with the same quiet kind and reason."""

    kind: str  # "hold" | "steady"
    reason: str
    started_ms: int
    ticks: int  # ticks in the run so far, the first one included
    last_rule: str
    last_ms: int
    logged: bool  # its start was written (its end will be)
    silent: tuple[str, ...] = ()  # the nodes named as its cause at its start (`StepResult.silent`)

    def end_fields(self, ended_by: str) -> dict[str, object]:
        """`rule` and `detail` of the record that closes this run."""
        seconds = (self.last_ms - self.started_ms) / 1000
        return {
            "rule": f"{self.kind} ({self.reason}) ended after {self.ticks} ticks over "
                    f"{seconds:g} s; last: {self.last_rule}",
            "detail": {
                "kind": self.kind,
                "reason": self.reason,
                "ticks": self.ticks,
                "started_ms": self.started_ms,
                "last_ms": self.last_ms,
                "last_rule": self.last_rule,
                "ended_by": ended_by,
            },
        }


@dataclass(frozen=True)
class RunUpdate:
    """What one tick means for the log: write the tick's record or not; a run that ended."""

    run: QuietRun | None  # the run in progress after this tick
    write_tick: bool  # the tick's own record is written
    ended: QuietRun | None  # a logged run that this tick ended (its end record goes first)


def follow_run(previous: QuietRun | None, result: StepResult, now_ms: int, *,
               first_tick: bool) -> RunUpdate:
    """The run after `result`; `first_tick` is this process's first tick for the pair."""
    ended = previous if previous is not None and previous.logged else None
    if result.kind not in QUIET_KINDS:
        return RunUpdate(None, True, ended)
    if previous is not None and (previous.kind, previous.reason, bool(previous.silent)) == (
            result.kind, result.reason, bool(result.silent)):
        longer = QuietRun(previous.kind, previous.reason, previous.started_ms, previous.ticks + 1,
                          result.rule, now_ms, previous.logged, previous.silent)
        return RunUpdate(longer, False, None)
    logged = not (result.kind == "steady" and first_tick)
    run = QuietRun(result.kind, result.reason, now_ms, 1, result.rule, now_ms, logged,
                   result.silent)
    return RunUpdate(run, logged, ended)
