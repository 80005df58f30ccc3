"""Reading the decision log: filters, --since parsing, order across files, follow mode."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from control_plane.decisions.log import DecisionLog
from control_plane.decisions.read import FileSource, Query, parse_since, since_cutoff
from harness.eventually import eventually_blocking

T0 = datetime(2024, 5, 1, 16, 0, tzinfo=UTC)


def write(tmp_path: Path, max_bytes: int = 10_000_000) -> None:
    moments = iter(T0 + timedelta(minutes=i) for i in range(100))
    with DecisionLog(tmp_path, clock=lambda: next(moments), max_bytes=max_bytes) as log:
        for i in range(12):
            log.record(["hold", "weight_shift", "return"][i % 3], pop=["ewr", "sjc"][i % 2],
                       group=["api", "img"][i // 6])


@pytest.mark.parametrize(
    ("query", "seqs"),
    [
        (Query(), list(range(1, 13))),
        (Query(pop="ewr"), [1, 3, 5, 7, 9, 11]),
        (Query(pop="ewr", group="img"), [7, 9, 11]),
        (Query(kinds=frozenset({"hold", "return"})), [1, 3, 4, 6, 7, 9, 10, 12]),
        (Query(since=T0 + timedelta(minutes=9)), [10, 11, 12]),
        (Query(pop="sjc", limit=2), [10, 12]),
        (Query(pop="nowhere"), []),
    ],
)
def test_filters(tmp_path: Path, query: Query, seqs: list[int]) -> None:
    write(tmp_path)
    assert [r["seq"] for r in FileSource(tmp_path).query(query)] == seqs


def test_filters_read_across_rotated_files_in_order(tmp_path: Path) -> None:
    write(tmp_path, max_bytes=400)
    assert len(list(tmp_path.glob("decisions.*.jsonl"))) >= 2
    assert [r["seq"] for r in FileSource(tmp_path).query(Query(pop="ewr"))] == [1, 3, 5, 7, 9, 11]


def test_missing_state_dir_has_no_records(tmp_path: Path) -> None:
    assert FileSource(tmp_path / "nothing").query(Query()) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10m", T0 - timedelta(minutes=10)),
        ("2h", T0 - timedelta(hours=2)),
        ("1d", T0 - timedelta(days=1)),
        ("30s", T0 - timedelta(seconds=30)),
        ("2024-04-30T12:00:00Z", datetime(2024, 4, 30, 12, tzinfo=UTC)),
        ("2024-04-30T14:00:00+02:00", datetime(2024, 4, 30, 12, tzinfo=UTC)),
        ("2024-04-30T12:00", datetime(2024, 4, 30, 12, tzinfo=UTC)),
    ],
)
def test_parse_since(text: str, expected: datetime) -> None:
    assert since_cutoff(parse_since(text), T0) == expected


@pytest.mark.parametrize("text", ["banana", "10", "m", "-5m", "10 minutes", ""])
def test_parse_since_rejects_nonsense(text: str) -> None:
    with pytest.raises(ValueError, match="duration such as 30s, 10m"):
        parse_since(text)


def test_query_to_params() -> None:
    query = Query(pop="ewr", kinds=frozenset({"return", "hold"}), since=T0, limit=5)
    assert query.to_params() == {"pop": "ewr", "limit": "5", "kind": "hold,return",
                                 "since": "2024-05-01T16:00:00+00:00"}


def test_follow_sees_new_records_across_rotation(tmp_path: Path) -> None:
    # every rotated file kept: a reader held off the CPU for longer than five rotations (about
    # 75 ms of these writes, seen on a loaded machine) would find its file deleted, which is
    # retention, not what this test is about
    log = DecisionLog(tmp_path, max_bytes=500, keep=50)
    log.record("hold", pop="ewr")
    done = threading.Event()
    seen: list[int] = []

    def reader() -> None:
        for record in FileSource(tmp_path).follow(Query(pop="ewr"), 1, 0.01, done.is_set):
            seen.append(record["seq"])

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(30):
            log.record("hold", pop=["ewr", "sjc"][i % 2], rule="r" * 40)
            time.sleep(0.005)
        eventually_blocking(lambda: len(seen) >= 15, 5, "the follower reads ewr's 15 records",
                            interval=0.02)
    finally:  # the reader stops even when the wait fails
        done.set()
        thread.join(5)
    log.close()
    assert len(list(tmp_path.glob("decisions.*.jsonl"))) >= 2  # it did rotate meanwhile
    assert seen == list(range(2, 32, 2))
