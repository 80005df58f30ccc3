"""The decision log writer: fsync'd appends, seq continuity, rotation, torn tails."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane.decisions.log import DecisionLog, draft, format_time, log_files
from control_plane.decisions.read import iter_records

T0 = datetime(2024, 5, 1, 16, 2, 10, 123456, tzinfo=UTC)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def spy_fsyncs(monkeypatch: pytest.MonkeyPatch, measure: Callable[[int], int]) -> list[int]:
    """From now on, every fsync appends `measure(fd)` (taken before the real fsync)."""
    synced: list[int] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(measure(fd))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return synced


def test_record_layout_and_time(tmp_path: Path) -> None:
    with DecisionLog(tmp_path, clock=lambda: T0) as log:
        record = log.record("weight_shift", pop="ewr", group="api",
                            weights_before={"a": 95, "b": 5}, weights_after={"a": 85, "b": 15},
                            rule="step cap 10", config_version="abc123", detail={"x": 1})
    assert record["time"] == "2024-05-01T16:02:10.123Z"
    assert list(record) == ["time", "seq", "kind", "pop", "group", "weights_before",
                            "weights_after", "inputs", "rule", "config_version", "detail"]
    assert lines(tmp_path / "decisions.jsonl") == [record]


def test_each_record_is_fsynced_before_record_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = DecisionLog(tmp_path)
    synced = spy_fsyncs(monkeypatch, lambda fd: os.fstat(fd).st_size)
    for count in range(1, 4):
        log.record("hold", pop="ewr", group="api")
        assert len(synced) == count
        assert synced[-1] == os.path.getsize(tmp_path / "decisions.jsonl")  # the whole record
    log.close()


def test_seq_continues_after_reopen(tmp_path: Path) -> None:
    with DecisionLog(tmp_path) as log:
        assert [log.record("hold")["seq"] for _ in range(3)] == [1, 2, 3]
    with DecisionLog(tmp_path) as log:
        assert log.record("steady")["seq"] == 4


def test_unknown_kind_or_field_is_refused_and_nothing_written(tmp_path: Path) -> None:
    with DecisionLog(tmp_path) as log:
        with pytest.raises(ValueError, match="unknown decision kind 'banana'"):
            log.record("banana")
        with pytest.raises(TypeError, match="colour"):
            log.record("hold", colour="red")
        assert log.record("hold")["seq"] == 1
    assert len(lines(tmp_path / "decisions.jsonl")) == 1


def test_rotation_keeps_n_files_and_seq_order(tmp_path: Path) -> None:
    with DecisionLog(tmp_path, max_bytes=600, keep=2) as log:
        for _ in range(40):
            log.record("hold", pop="ewr", group="api", rule="x" * 50)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["decisions.1.jsonl", "decisions.2.jsonl", "decisions.jsonl"]
    assert all(p.stat().st_size <= 600 for p in tmp_path.iterdir())
    seqs = [r["seq"] for r in iter_records(tmp_path)]
    assert seqs == list(range(seqs[0], 41))  # oldest files dropped, the rest in order
    assert seqs[0] > 1
    assert [p.name for p in log_files(tmp_path)] == [
        "decisions.2.jsonl", "decisions.1.jsonl", "decisions.jsonl"
    ]


def test_seq_continues_from_rotated_file_when_current_is_empty(tmp_path: Path) -> None:
    with DecisionLog(tmp_path, max_bytes=300) as log:
        for _ in range(5):
            log.record("hold")
    (tmp_path / "decisions.jsonl").rename(tmp_path / "decisions.1.jsonl")
    (tmp_path / "decisions.jsonl").write_bytes(b"")
    with DecisionLog(tmp_path) as log:
        assert log.record("hold")["seq"] == 6


def test_torn_last_line_is_skipped_and_writer_starts_a_fresh_line(tmp_path: Path) -> None:
    with DecisionLog(tmp_path) as log:
        log.record("hold", rule="one")
        log.record("hold", rule="two")
    path = tmp_path / "decisions.jsonl"
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"time":"2024-05-01T16:00:00.000Z","seq":3,"kind":"we')  # kill -9
    assert [r["seq"] for r in iter_records(tmp_path)] == [1, 2]
    with DecisionLog(tmp_path) as log:
        assert log.record("hold", rule="three")["seq"] == 3
    assert [r["rule"] for r in iter_records(tmp_path)] == ["one", "two", "three"]
    assert path.read_bytes().count(b"\n") == 4  # torn line closed, then the new record


def test_clock_drives_time(tmp_path: Path) -> None:
    moments = iter([T0, T0 + timedelta(seconds=20)])
    with DecisionLog(tmp_path, clock=lambda: next(moments)) as log:
        first, second = log.record("hold"), log.record("hold")
    assert (first["time"], second["time"]) == (format_time(T0),
                                                "2024-05-01T16:02:30.123Z")


def test_routine_records_share_fsyncs_and_are_readable_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = DecisionLog(tmp_path)
    # how many lines each fsync made durable
    synced = spy_fsyncs(monkeypatch, lambda fd: len(lines(log.path)))
    for index in range(50):
        log.record("node_connected", durable=False, detail={"node": f"n{index}"})
    assert synced == []
    assert len(list(iter_records(tmp_path))) == 50, "readable before they are durable"
    log.sync()
    assert synced == [50]
    log.sync()  # nothing new: no fsync
    log.record("node_connected", durable=False)
    log.record("nack", pop="ewr")  # a durable record also covers the routine one before it
    assert synced == [50, 52]
    log.record("node_disconnected", durable=False)
    log.close()
    assert synced == [50, 52, 53], "close() makes the rest durable"


@settings(max_examples=60)
@given(
    fields=st.fixed_dictionaries({}, optional={
        "pop": st.text(max_size=8), "group": st.text(max_size=8),
        "weights_before": st.dictionaries(st.text(max_size=5), st.integers(0, 100), max_size=3),
        "rule": st.text(max_size=30),
        "detail": st.dictionaries(st.text(max_size=5), st.none() | st.floats(allow_nan=False)
                                  | st.text(max_size=5), max_size=3)}),
    origin=st.sampled_from([{}, {"replica": "r-1", "term": 7}]),
    count=st.integers(1, 4),
)
def test_drafts_written_in_one_go_are_the_records_record_would_write(
    tmp_path_factory: pytest.TempPathFactory, fields: dict[str, Any], origin: dict[str, Any],
    count: int,
) -> None:
    """A tick's records are made on a worker thread (`draft`) and written together; each line
    is exactly the JSON of the record returned and told to listeners."""
    folder = tmp_path_factory.mktemp("drafts")
    log = DecisionLog(folder, clock=lambda: datetime(2026, 11, 30, 16, 0, tzinfo=UTC))
    log.origin = origin
    told: list[dict[str, Any]] = []
    log.add_listener(told.append)
    written = log.write_drafts([draft("hold", **fields) for _ in range(count)], durable=False)
    log.sync()
    lines = (folder / "decisions.jsonl").read_bytes().splitlines()
    assert [json.loads(line) for line in lines] == written == told
    assert lines == [json.dumps(r, separators=(",", ":"), ensure_ascii=False).encode()
                     for r in written]
    assert [r["seq"] for r in written] == list(range(1, count + 1)) and log.seq == count
    log.close()

