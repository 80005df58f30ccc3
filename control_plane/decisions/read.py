"""Reading the decision log: records across rotated files in order, filters, and follow mode.

A ``RecordSource`` is where records come from. ``FileSource`` reads the state directory with
bounded memory (`scan.py`: since/after bisect, limit scans backwards, records stream one at a
time); a source reading a running server's admin API (``/decisions?...``, built from
``Query.to_params``) implements the same methods, and the CLI does not change.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from control_plane.decisions.log import CURRENT, log_files, parse_line
from control_plane.decisions.scan import MAX_LINE_BYTES, LogView

_DURATION = re.compile(r"^\s*(\d+)\s*(s|m|h|d|w)\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
MAX_SINCE = timedelta(days=100 * 366)

Record = dict[str, Any]


def parse_since(text: str) -> timedelta | datetime:
    """``10m``, ``2h``, ``1d`` (ago) or an ISO-8601 time (UTC when no offset is given)."""
    match = _DURATION.match(text)
    if match:
        digits = match.group(1)
        try:
            ago = timedelta(**{_UNITS[match.group(2)]: int(digits)}) if len(digits) < 16 else None
        except OverflowError:
            ago = None
        if ago is None or ago > MAX_SINCE:
            raise ValueError(
                f"{text.strip()[:32]!r} is too far back: at most {MAX_SINCE.days}d (100 years)"
            )
        return ago
    if len(text) > 64:
        raise ValueError(f"cannot read a {len(text):,}-character text as a time")
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"cannot read {text!r} as a time: use a duration such as 30s, 10m, 2h, 1d "
            f"or an ISO-8601 time such as 2024-05-01T16:00:00Z"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def since_cutoff(since: timedelta | datetime, now: datetime) -> datetime:
    """The earliest time wanted; ValueError when it is before year 1."""
    if isinstance(since, datetime):
        return since
    try:
        return now - since
    except OverflowError:
        raise ValueError(f"{since.days}d ago is before year 1") from None


def record_time(record: Record) -> datetime:
    return datetime.fromisoformat(str(record["time"]).replace("Z", "+00:00"))


@dataclass(frozen=True)
class Query:
    """Which records: all filters must match; ``limit`` keeps the newest N."""

    pop: str | None = None
    group: str | None = None
    kinds: frozenset[str] = field(default_factory=frozenset)
    since: datetime | None = None
    limit: int | None = None

    def matches(self, record: Record) -> bool:
        return (
            (self.pop is None or record.get("pop") == self.pop)
            and (self.group is None or record.get("group") == self.group)
            and (not self.kinds or record.get("kind") in self.kinds)
            and (self.since is None or record_time(record) >= self.since)
        )

    def to_params(self) -> dict[str, str]:
        """The same query as URL parameters (for an admin API)."""
        params = {"pop": self.pop, "group": self.group, "limit": self.limit}
        out = {key: str(value) for key, value in params.items() if value is not None}
        if self.kinds:
            out["kind"] = ",".join(sorted(self.kinds))
        if self.since is not None:
            out["since"] = self.since.isoformat()
        return out


def select(records: Iterable[Record], query: Query) -> list[Record]:
    matching = [record for record in records if query.matches(record)]
    if query.limit is not None:
        return matching[-query.limit:] if query.limit else []
    return matching


def _complete_lines(path: Path, offset: int) -> Iterator[tuple[Record, int]]:
    """Records in whole lines from ``offset``, each with the offset after its line; lines
    longer than the readers' bound are skipped."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        skipping = False
        while True:
            line = handle.readline(MAX_LINE_BYTES + 1)
            if not line.endswith(b"\n"):
                if len(line) <= MAX_LINE_BYTES:
                    return  # the end, or a line still being written
                skipping = True
                offset += len(line)
                continue
            offset += len(line)
            if skipping:
                skipping = False
                continue
            record = parse_line(line)
            if record is not None:
                yield record, offset


def iter_records(state_dir: Path) -> Iterator[Record]:
    """Every record, oldest first, across rotated files; torn lines are skipped."""
    with LogView(state_dir) as view:
        for _, record in view.records():
            yield record


def stream_records(state_dir: Path, query: Query, after_seq: int = 0) -> Iterator[Record]:
    """The records `query` selects with seq > `after_seq`, oldest first, one at a time; with
    `limit`, the newest that many. Reads only what it must (see `scan.py`)."""
    since = query.since
    with LogView(state_dir) as view:
        start = (0, 0)
        if since is not None:
            start = view.first(lambda record: record_time(record) >= since)
        if after_seq:
            start = max(start, view.first(lambda record: record["seq"] > after_seq))

        def wanted(record: Record) -> bool:
            return record["seq"] > after_seq and query.matches(record)

        if query.limit is not None:
            start = view.newest(wanted, query.limit, start)
        left = query.limit
        for _, record in view.records(start):
            if wanted(record):
                yield record
                if left is not None:
                    left -= 1
                    if left <= 0:
                        return


class RecordSource(Protocol):
    def query(self, query: Query) -> list[Record]: ...

    def records(self, query: Query, after_seq: int = 0) -> Iterator[Record]: ...

    def follow(
        self, query: Query, after_seq: int, poll_s: float, stop: Callable[[], bool]
    ) -> Iterator[Record]: ...


class FileSource:
    """Records from a state directory on this machine."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.state_dir = Path(state_dir)

    def __str__(self) -> str:
        return str(self.state_dir)

    def query(self, query: Query) -> list[Record]:
        return list(self.records(query))

    def records(self, query: Query, after_seq: int = 0) -> Iterator[Record]:
        return stream_records(self.state_dir, query, after_seq)

    def _rotated_since(self, inode: int, offset: int) -> list[Record]:
        """After rotation: the rest of the file we were reading, then any newer rotated file."""
        rotated = [path for path in log_files(self.state_dir) if path.name != CURRENT]
        try:
            inodes = [path.stat().st_ino for path in rotated]
            if inode not in inodes:
                return []
            start = inodes.index(inode)
            records = [record for record, _ in _complete_lines(rotated[start], offset)]
            for path in rotated[start + 1:]:
                records += [record for record, _ in _complete_lines(path, 0)]
        except FileNotFoundError:  # rotated again while we read: the seq check keeps order
            return []
        return records

    def follow(
        self, query: Query, after_seq: int, poll_s: float, stop: Callable[[], bool]
    ) -> Iterator[Record]:
        """New matching records with seq > after_seq as they are written, until ``stop()``."""
        current = self.state_dir / CURRENT
        inode: int | None = None
        offset = 0
        last = after_seq
        with LogView(self.state_dir) as view:  # start at the first newer record if it is in
            resume = view.in_current(view.first(lambda record: record["seq"] > after_seq))
        if resume is not None:  # the current file, not at the current file's start
            inode, offset = resume
        while not stop():
            fresh: list[Record] = []
            try:
                status = current.stat()
            except FileNotFoundError:
                status = None
            if status is not None:
                if inode is not None and status.st_ino != inode:
                    fresh += self._rotated_since(inode, offset)
                    offset = 0
                inode = status.st_ino
                for record, after in _complete_lines(current, offset):
                    fresh.append(record)
                    offset = after
            for record in fresh:
                if record["seq"] > last:
                    last = record["seq"]
                    if query.matches(record):
                        yield record
            time.sleep(poll_s)
