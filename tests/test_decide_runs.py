"""Runs of quiet ticks (`decide/runs.py`): one record when a run starts, one when it ends."""

from __future__ import annotations

from dataclasses import replace

import pytest

from control_plane.decide.controller import ControllerState, StepResult
from control_plane.decide.inputs import LazyInputs
from control_plane.decide.runs import QuietRun, follow_run


def result(kind: str, reason: str = "", rule: str = "r") -> StepResult:
    weights = {"a": 95, "b": 5}
    return StepResult(kind, rule, "next", weights, dict(weights), {}, ControllerState(),  # type: ignore[arg-type]
                      LazyInputs(dict), reason or kind)


def walk(steps: list[StepResult]) -> list[str]:
    """What the log gets for a sequence of ticks 20 s apart: kinds, end records as `end(kind,n)`."""
    out: list[str] = []
    run: QuietRun | None = None
    for index, item in enumerate(steps):
        step = follow_run(run, item, index * 20_000, first_tick=index == 0)
        if step.ended is not None:
            out.append(f"end({step.ended.kind},{step.ended.ticks})")
        if step.write_tick:
            out.append(item.kind)
        run = step.run
    return out


HOLD = result("hold", "fail_static")
WAIT = result("hold", "return_wait")
STEADY = result("steady")
BREACH = result("threshold_breach")
SHIFT = result("weight_shift")


@pytest.mark.parametrize(("ticks", "logged"), [
    ([HOLD] * 50, ["hold"]),
    ([HOLD] * 3 + [STEADY] * 4, ["hold", "end(hold,3)", "steady"]),
    ([STEADY] * 10, []),  # steady since the process started: nothing happened
    ([STEADY] * 3 + [BREACH], ["threshold_breach"]),
    ([HOLD, STEADY, STEADY, BREACH, SHIFT],
     ["hold", "end(hold,1)", "steady", "end(steady,2)", "threshold_breach", "weight_shift"]),
    ([SHIFT, HOLD, HOLD, WAIT, WAIT, WAIT, SHIFT],
     ["weight_shift", "hold", "end(hold,2)", "hold", "end(hold,3)", "weight_shift"]),
    ([BREACH, BREACH, SHIFT, SHIFT], ["threshold_breach", "threshold_breach", "weight_shift",
                                     "weight_shift"]),
])
def test_quiet_runs_log_their_start_and_end(ticks: list[StepResult], logged: list[str]) -> None:
    assert walk(ticks) == logged


def test_the_end_record_says_how_long_and_what_ended_it() -> None:
    run = None
    for index in range(4):
        run = follow_run(run, result("hold", "fail_static", rule=f"tick {index}"), index * 20_000,
                         first_tick=index == 0).run
    step = follow_run(run, STEADY, 80_000, first_tick=False)
    assert step.ended is not None
    fields = step.ended.end_fields("steady")
    assert fields["detail"] == {
        "kind": "hold", "reason": "fail_static", "ticks": 4, "started_ms": 0, "last_ms": 60_000,
        "last_rule": "tick 3", "ended_by": "steady",
    }
    assert "4 ticks over 60 s" in str(fields["rule"])


def test_no_evidence_is_recorded_on_its_first_tick_and_ends_a_steady_run() -> None:
    quiet = result("hold", "no_evidence")
    assert walk([quiet, quiet, quiet]) == ["hold"]  # the process's first tick too
    assert walk([STEADY, STEADY, quiet, quiet, STEADY]) == [
        "hold", "end(hold,2)", "steady"]


def test_which_nodes_are_silent_makes_no_new_run_but_the_first_silent_node_does() -> None:
    """The soak bench's 1,000 churning nodes changed a PoP's silent set every few seconds, and a
    run per set wrote ~10 hold and 10 hold_ended records a second: the run changes when silent
    nodes become (or stop being) its cause, not when they are other nodes."""
    def silent(*nodes: str) -> StepResult:
        return replace(result("hold", "no_evidence"), silent=nodes)

    quiet = result("hold", "no_evidence")
    assert walk([silent("n1"), silent("n2"), silent("n1", "n3"), silent("n4")] * 5) == ["hold"]
    assert walk([quiet, quiet, silent("n1"), silent("n2"), quiet]) == [
        "hold", "end(hold,2)", "hold", "end(hold,2)", "hold"]
    first = follow_run(None, silent("n1", "n2"), 0, first_tick=True).run
    assert first is not None and first.silent == ("n1", "n2")  # its start names them
