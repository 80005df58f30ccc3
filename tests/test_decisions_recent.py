"""Bounded reads of the decision log (`decisions/recent.py`): the same answers as a full read,
for the price of the part they need."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from control_plane.decisions.log import DecisionLog, log_files
from control_plane.decisions.read import Query, iter_records, select
from control_plane.decisions.recent import by_seq, newest

T0 = datetime(2024, 5, 1, 16, 0, tzinfo=UTC)
POPS = ("ewr", "sjc", "fra")
GROUPS = ("shop", "img")
KINDS = ("hold", "weight_shift", "return", "nack")


def write(state_dir: Path, count: int, *, max_bytes: int = 10_000_000, keep: int = 5) -> None:
    moments = iter(T0 + timedelta(seconds=i) for i in range(count))
    with DecisionLog(state_dir, clock=lambda: next(moments), max_bytes=max_bytes,
                     keep=keep) as log:
        for i in range(count):
            log.record(KINDS[i % 4], durable=False, pop=POPS[i % 3], group=GROUPS[i % 2],
                       rule=f"record {i} " + "x" * (i % 17))  # one fsync at close is enough


queries = st.builds(
    Query,
    pop=st.sampled_from((None, *POPS)),
    group=st.sampled_from((None, *GROUPS)),
    kinds=st.frozensets(st.sampled_from(KINDS), max_size=2),
    since=st.one_of(st.none(), st.integers(0, 400).map(lambda s: T0 + timedelta(seconds=s))),
    limit=st.one_of(st.none(), st.integers(1, 50)),
)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=queries)
def test_newest_answers_like_a_full_read_across_rotated_files(
    tmp_path_factory: pytest.TempPathFactory, query: Query
) -> None:
    state_dir = tmp_path_factory.getbasetemp() / "rotated"
    if not state_dir.exists():
        write(state_dir, 300, max_bytes=6000)
    assert len(log_files(state_dir)) > 3
    window = newest(state_dir, query)
    assert not window.truncated
    assert window.records == select(iter_records(state_dir), query)


def test_newest_reads_only_as_far_back_as_the_range(tmp_path: Path) -> None:
    write(tmp_path, 20_000)
    size = sum(path.stat().st_size for path in log_files(tmp_path))
    window = newest(tmp_path, Query(pop="ewr", since=T0 + timedelta(seconds=19_900)))
    assert [r["seq"] for r in window.records] == list(range(19_903, 20_001, 3))
    assert window.scanned_bytes < size / 5
    assert not window.exhausted


def test_newest_stops_at_the_limit(tmp_path: Path) -> None:
    write(tmp_path, 3000)
    window = newest(tmp_path, Query(kinds=frozenset({"nack"}), limit=2))
    assert [r["seq"] for r in window.records] == [2996, 3000]
    assert window.scanned_bytes < 300_000


def test_newest_says_truncated_when_the_byte_cap_ends_the_scan(tmp_path: Path) -> None:
    write(tmp_path, 3000)
    window = newest(tmp_path, Query(pop="nowhere"), max_bytes=50_000)
    assert window.records == []
    assert window.truncated
    assert window.scanned_bytes <= 50_000 + 256 * 1024


def test_newest_reaching_the_oldest_record_says_exhausted(tmp_path: Path) -> None:
    write(tmp_path, 50)
    window = newest(tmp_path, Query(pop="sjc"))
    assert window.exhausted and not window.truncated
    assert window.records[0]["seq"] == 2


def test_newest_skips_a_torn_last_line(tmp_path: Path) -> None:
    write(tmp_path, 10)
    with open(tmp_path / "decisions.jsonl", "ab") as handle:
        handle.write(b'{"time":"2024-05-01T16:00:11.000Z","seq":11,"ki')
    assert [r["seq"] for r in newest(tmp_path, Query(limit=2)).records] == [9, 10]


def test_by_seq_finds_every_record_across_rotated_files(tmp_path: Path) -> None:
    write(tmp_path, 400, max_bytes=9000, keep=50)
    assert len(log_files(tmp_path)) > 3
    for seq in (1, 2, 57, 199, 200, 201, 399, 400):
        record = by_seq(tmp_path, seq)
        assert record is not None and record["seq"] == seq
        assert record["rule"].startswith(f"record {seq - 1} ")
    assert by_seq(tmp_path, 401) is None
    assert by_seq(tmp_path, 0) is None


def test_by_seq_bisects_a_large_file(tmp_path: Path) -> None:
    write(tmp_path, 20_000)
    assert (tmp_path / "decisions.jsonl").stat().st_size > 1_000_000
    for seq in (1, 9_999, 10_000, 19_999, 20_000):
        record = by_seq(tmp_path, seq)
        assert record is not None and record["seq"] == seq


def test_by_seq_of_a_rotated_away_record_is_none(tmp_path: Path) -> None:
    write(tmp_path, 400, max_bytes=6000, keep=2)
    oldest = next(iter_records(tmp_path))["seq"]
    assert oldest > 1
    assert by_seq(tmp_path, oldest - 1) is None
    assert by_seq(tmp_path, oldest) is not None
