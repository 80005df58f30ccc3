"""The one decision recorder: every writer's records, through a full disk, in order, counted.

A real decision log in a temporary folder; the full disk is the log's write raising ENOSPC.
"""

from __future__ import annotations

import asyncio
import errno
import threading
from pathlib import Path
from typing import Any

import pytest

from control_plane.decisions.log import DecisionLog, Lines, draft
from control_plane.decisions.rate_limit import RateLimit, RecordLimiter
from control_plane.decisions.read import iter_records
from control_plane.decisions.recorder import LINES_OFF_LOOP, DecisionRecorder
from control_plane.own_metrics.registry import BallastMetrics


def full_disk(*args: Any, **kwargs: Any) -> Any:
    raise OSError(errno.ENOSPC, "No space left on device")


def counted(metrics: BallastMetrics, kind: str) -> float:
    return metrics.decisions.labels(kind)._value.get()


def test_a_full_disk_keeps_every_writers_records_in_order_until_the_log_takes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = BallastMetrics()
    with DecisionLog(tmp_path) as log:
        recorder = DecisionRecorder(log, metrics=metrics)
        recorder.record("startup", rule="serving")
        with monkeypatch.context() as full:
            full.setattr(log, "write_drafts", full_disk)
            full.setattr(log, "append_replicated", full_disk)
            recorder.write([draft("hold", pop="ewr", group="shop", rule="a tick's"),
                            draft("weight_shift", pop="sjc", group="shop", rule="a tick's")])
            recorder.replicated({"time": "2026-12-01T00:00:00.000Z", "kind": "leader_elected",
                                 "rule": "another replica's", "replica": "r1", "term": 3})
            recorder.record("config_applied", rule="a reload's")
            assert recorder.waiting == 4 and recorder.error is not None
            assert "No space left" in recorder.error
            assert counted(metrics, "hold") == 0  # not in the log: not counted
        recorder.flush()
        assert recorder.waiting == 0 and recorder.error is None
    records = list(iter_records(tmp_path))
    assert [r["rule"] for r in records] == ["serving", "a tick's", "a tick's",
                                            "another replica's", "a reload's"]
    assert [r["seq"] for r in records] == [1, 2, 3, 4, 5]
    late = [r for r in records if "recorded_late" in (r["detail"] or {})]
    assert [r["kind"] for r in late] == ["hold", "weight_shift", "config_applied"]
    assert "No space left" in late[0]["detail"]["recorded_late"]["reason"]
    assert records[3]["replica"] == "r1" and records[3]["term"] == 3  # its own, kept
    assert counted(metrics, "hold") == counted(metrics, "config_applied") == 1


def test_past_its_bound_the_oldest_kept_records_are_dropped_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with DecisionLog(tmp_path) as log:
        recorder = DecisionRecorder(log, keep=3)
        with monkeypatch.context() as full:
            full.setattr(log, "write_drafts", full_disk)
            for n in range(5):
                recorder.record("hold", pop="ewr", group="shop", rule=f"tick {n}")
            assert recorder.waiting == 3 and recorder.dropped == 2
        recorder.flush()
    assert [r["rule"] for r in iter_records(tmp_path)] == ["tick 2", "tick 3", "tick 4"]


def test_routine_records_over_the_rate_limit_are_counted_and_noted_once(tmp_path: Path) -> None:
    limiter = RecordLimiter(RateLimit(burst_bytes=1000, bytes_per_s=1), clock=lambda: 0.0)
    with DecisionLog(tmp_path) as log:
        recorder = DecisionRecorder(log, limiter=limiter)
        written = [recorder.routine("node_connected", pop="ewr", rule="node n connected",
                                    detail={"node": f"n{n}"}) for n in range(10)]
        assert written[0] and not written[-1]
        recorder.record("weight_shift", pop="ewr", group="shop", rule="never limited")
        recorder.flush()
    kinds = [r["kind"] for r in iter_records(tmp_path)]
    assert kinds.count("records_suppressed") == 1 and "weight_shift" in kinds
    (note,) = [r for r in iter_records(tmp_path) if r["kind"] == "records_suppressed"]
    assert note["detail"]["suppressed"] == {"node_connected": written.count(False)}


async def test_a_large_batch_is_made_off_the_loop_and_other_writers_follow_it_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change's 150 records have their lines made on a worker thread; a routine record, a
    replicated one and the periodic flush that come meanwhile wait and land after the batch,
    in the order they came, with seqs that follow; a replicated value that is no record is
    refused at once, as when nothing is held."""
    threads: dict[int, int] = {}  # records -> the thread that made their lines
    made = Lines.made

    def on_thread(lines: Lines) -> Any:
        threads.setdefault(len(lines.drafts), threading.get_ident())
        return made(lines)

    monkeypatch.setattr(Lines, "made", on_thread)
    with DecisionLog(tmp_path) as log:
        recorder = DecisionRecorder(log)
        recorder.record("startup", rule="serving")
        batch = [draft("hold", pop=f"p{i:03d}", group="g", rule="the tick's")
                 for i in range(LINES_OFF_LOOP + 50)]
        writing = asyncio.create_task(recorder.write_synced(batch))
        await asyncio.sleep(0)  # the batch's lines are being made on a thread
        assert log.seq == 1
        recorder.record("node_connected", rule="meanwhile", durable=False)
        recorder.replicated({"time": "2026-12-01T00:00:00.000Z", "kind": "leader_elected",
                             "rule": "another replica's", "replica": "r1", "term": 3})
        with pytest.raises(ValueError, match="not a replicated decision record"):
            recorder.replicated({"kind": "hold", "rule": "no replica"})
        recorder.flush()
        await writing
    assert threads[len(batch)] != threading.get_ident()
    records = list(iter_records(tmp_path))
    assert [r["rule"] for r in records] == ["serving", *["the tick's"] * len(batch),
                                            "meanwhile", "another replica's"]
    assert [r["seq"] for r in records] == list(range(1, len(batch) + 4))


async def test_a_batch_made_while_the_disk_is_full_waits_behind_the_kept_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with DecisionLog(tmp_path) as log:
        recorder = DecisionRecorder(log)
        with monkeypatch.context() as full:
            full.setattr(log, "write_drafts", full_disk)
            recorder.record("startup", rule="kept")
            await recorder.write_synced([draft("hold", pop=f"p{i}", group="g", rule="batch")
                                         for i in range(LINES_OFF_LOOP)])
            assert recorder.waiting == LINES_OFF_LOOP + 1
        recorder.flush()
    assert [r["rule"] for r in iter_records(tmp_path)] == ["kept", *["batch"] * LINES_OFF_LOOP]


async def test_a_batch_cancelled_while_its_lines_are_made_lets_the_held_records_through(
    tmp_path: Path
) -> None:
    with DecisionLog(tmp_path) as log:
        recorder = DecisionRecorder(log)
        writing = asyncio.create_task(recorder.write_synced(
            [draft("hold", pop=f"p{i}", group="g", rule="batch") for i in range(LINES_OFF_LOOP)]))
        await asyncio.sleep(0)
        recorder.record("shutdown", rule="held")
        writing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await writing
        recorder.record("startup", rule="after")
    assert [r["rule"] for r in iter_records(tmp_path)] == ["held", "after"]
