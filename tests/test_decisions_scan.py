"""Bounded decision-log queries (issue 8): the same answers as reading everything, with memory
and parsing bounded by the answer; bad parameters and bad lines give 400 / clear messages."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from control_plane.cli.admin_client import AdminClient, ServerSource
from control_plane.cli.main import main
from control_plane.decisions import scan
from control_plane.decisions.log import parse_line
from control_plane.decisions.read import FileSource, Query, parse_since, select, stream_records
from harness.ads_desired import desired
from tests.support.admin_stack import AdminStack, serving, start_stack

T0 = datetime(2026, 1, 1, tzinfo=UTC)
KINDS = ("hold", "weight_shift", "nack")


def _line(seq: int, kind: str, pop: str, at: datetime, pad: int = 0) -> bytes:
    record = {"time": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"), "seq": seq,
              "kind": kind, "pop": pop, "group": "shop", "rule": "r" * pad}
    return (json.dumps(record, separators=(",", ":")) + "\n").encode()


def _write_log(state_dir: Path, files: list[list[bytes]]) -> None:
    """`files` oldest first: rotated files decisions.N..1, then decisions.jsonl."""
    state_dir.mkdir(parents=True, exist_ok=True)
    for index, lines in enumerate(files):
        rotated = len(files) - 1 - index
        name = f"decisions.{rotated}.jsonl" if rotated else "decisions.jsonl"
        (state_dir / name).write_bytes(b"".join(lines))


def _reference(state_dir: Path) -> list[dict[str, Any]]:
    """Every record, reading everything (what the bounded reader must agree with)."""
    from control_plane.decisions.log import log_files

    records = []
    for path in log_files(state_dir):
        for line in path.read_bytes().split(b"\n")[:-1]:  # the last piece is a torn tail
            if len(line) < scan.MAX_LINE_BYTES and (record := parse_line(line)) is not None:
                records.append(record)
    return records


# a log: records in seq order spread over files, with foreign, torn, over-long and bad-time lines
_noise = st.sampled_from([
    b"not json\n",
    b'{"seq": 1.5, "time": "2026-01-01T00:00:00Z"}\n',
    b'{"seq": 7, "time": "yesterday"}\n',  # a bad time: skipped, never a 500 or a traceback
    b'{"seq": 7, "time": "2026-01-01T00:00:00"}\n',  # no offset
    b"[" * 5000 + b"\n",
    b"x" * (scan.MAX_LINE_BYTES + 10) + b"\n",  # over-long
])


@st.composite
def _logs(draw: st.DrawFn) -> list[list[bytes]]:
    count = draw(st.integers(0, 120))
    files: list[list[bytes]] = [[]]
    for seq in range(1, count + 1):
        if draw(st.integers(0, 30)) == 0:
            files.append([])
        if draw(st.integers(0, 10)) == 0:
            files[-1].append(draw(_noise))
        at = T0 + timedelta(seconds=seq * 10)
        pad = draw(st.sampled_from([0, 0, 0, 300, 70_000]))
        files[-1].append(_line(seq, draw(st.sampled_from(KINDS)), draw(st.sampled_from("ab")),
                               at, pad))
    if draw(st.booleans()):
        files[-1].append(b'{"seq": 999999, "time": "2026-')  # torn tail
    return files


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    files=_logs(),
    pop=st.sampled_from([None, "a"]),
    kinds=st.sampled_from([frozenset(), frozenset({"hold"})]),
    since_s=st.one_of(st.none(), st.integers(-10, 1300)),
    after=st.integers(0, 130),
    limit=st.one_of(st.none(), st.integers(1, 130)),
)
def test_bounded_reader_answers_like_reading_everything(
    tmp_path_factory: pytest.TempPathFactory, files: list[list[bytes]], pop: str | None,
    kinds: frozenset[str], since_s: int | None, after: int, limit: int | None,
) -> None:
    state_dir = tmp_path_factory.mktemp("log")
    _write_log(state_dir, files)
    since = None if since_s is None else T0 + timedelta(seconds=since_s)
    query = Query(pop=pop, kinds=kinds, since=since, limit=limit)
    expected = select([r for r in _reference(state_dir) if r["seq"] > after], query)
    assert list(stream_records(state_dir, query, after)) == expected


def _big_log(state_dir: Path, records: int) -> None:
    lines = [_line(seq, KINDS[seq % 3], "ab"[seq % 2], T0 + timedelta(seconds=seq), pad=150)
             for seq in range(1, records + 1)]
    _write_log(state_dir, [lines[: records // 2], lines[records // 2:]])


def test_queries_on_a_large_log_parse_and_hold_little(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """~40 MB of log: the newest 5, a `since` near the end and an `after` seq each parse a few
    hundred lines at most and stay under 2 MB of Python memory (before: the whole log)."""
    _big_log(tmp_path, 160_000)
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) > 39_000_000
    parsed = [0]
    real_parse = scan.parse_line

    def counting(line: bytes) -> Any:
        parsed[0] += 1
        return real_parse(line)

    monkeypatch.setattr(scan, "parse_line", counting)
    queries = [
        (Query(limit=5), 0, list(range(159_996, 160_001))),
        (Query(since=T0 + timedelta(seconds=159_990)), 0, list(range(159_990, 160_001))),
        (Query(kinds=frozenset({"hold"})), 159_980, [159_981, 159_984, 159_987, 159_990,
                                                     159_993, 159_996, 159_999]),
        (Query(pop="a", limit=3), 0, [159_996, 159_998, 160_000]),
    ]
    for query, after, seqs in queries:
        parsed[0] = 0
        tracemalloc.start()
        got = [r["seq"] for r in stream_records(tmp_path, query, after)]
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert got == seqs
        assert parsed[0] < 1_000, (query, parsed[0])
        assert peak < 2_000_000, (query, peak)


def test_since_that_cannot_be_a_time_is_a_clear_error() -> None:
    for text, message in [("99999999d", "too far back"), ("999999999999999w", "too far back"),
                          ("9" * 100, "cannot read")]:
        with pytest.raises(ValueError, match=message):
            parse_since(text)


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[AdminStack]:
    lines = [_line(seq, "hold", "a", datetime.now(UTC) - timedelta(minutes=60 - seq))
             for seq in range(1, 40)]
    lines.insert(10, b'{"seq": 999, "time": "not a time", "kind": "hold"}\n')
    # a record as the old server wrote it: a node id of megabytes
    lines.insert(20, _line(500, "nack", "a", datetime.now(UTC), pad=3_000_000))
    _write_log(tmp_path, [lines])
    the_stack = await start_stack(
        desired(listener_port=10000, primary_port=8081, secondary_port=8082), tmp_path
    )
    try:
        yield the_stack
    finally:
        await the_stack.stop()


async def test_admin_decisions_streams_bounded_and_rejects_bad_parameters(
    stack: AdminStack,
) -> None:
    async with aiohttp.ClientSession(stack.url) as http:
        for query, message in [("since=99999999d", "too far back"),
                               ("since=" + "1" * 200, "cannot read")]:
            async with http.get(f"/decisions?{query}") as response:
                assert response.status == 400
                assert message in (await response.json())["error"]
        async with http.get("/decisions?limit=5") as response:
            assert response.status == 200
            body = await response.read()
        assert len(body) < 5_000  # the megabytes-long line is skipped, not sent
        assert [r["seq"] for r in json.loads(body)["records"]] == [35, 36, 37, 38, 39]
        async with http.get("/decisions?since=2h") as response:
            records = json.loads(await response.read())["records"]
        assert [r["seq"] for r in records] == list(range(1, 40))  # the bad-time line skipped


def test_cli_decisions_bad_since_and_bad_lines_give_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_log(tmp_path, [[_line(1, "hold", "a", T0), b'{"seq": 2, "time": "soon"}\n',
                           _line(3, "hold", "a", T0 + timedelta(seconds=1))]])
    with pytest.raises(SystemExit) as exit_info:
        main(["decisions", "--state-dir", str(tmp_path), "--since", "99999999d"])
    assert exit_info.value.code == 2
    assert "too far back" in capsys.readouterr().err
    assert main(["decisions", "--state-dir", str(tmp_path), "--json"]) == 0
    out = capsys.readouterr()
    assert [json.loads(line)["seq"] for line in out.out.splitlines()] == [1, 3]
    assert "Traceback" not in out.err
    assert FileSource(tmp_path).query(Query(limit=1))[0]["seq"] == 3


def test_cli_reads_a_long_answer_from_the_server_as_it_streams(tmp_path: Path) -> None:
    """`ballast decisions --server`: records decoded as they arrive, never the whole answer at
    once (20,000 records, ~6 MB of JSON, each split across read blocks somewhere)."""
    lines = [_line(seq, "hold", "a", T0 + timedelta(seconds=seq), pad=200)
             for seq in range(1, 20_001)]
    lines[7] = _line(8, "hold", "a", T0 + timedelta(seconds=8)).replace(b'"rule":""',
                                                                        '"rule":"é→✓"'.encode())
    _write_log(tmp_path, [lines])
    with serving(desired(listener_port=10000, primary_port=8081, secondary_port=8082),
                 tmp_path) as (_, stack):
        source = ServerSource(AdminClient(stack.url))
        tracemalloc.start()
        seqs = [record["seq"] for record in source.records(Query())]
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert seqs == list(range(1, 20_001))
        assert peak < 4_000_000, peak  # server and client together; the answer is ~6 MB
        assert source.query(Query(limit=1), after_seq=7)[0]["seq"] == 20_000
        assert next(iter(source.records(Query(), after_seq=7)))["rule"] == "é→✓"
