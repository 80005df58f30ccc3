"""Reading the decision log: records across rotated files in order, filters, and follow mode.

A ``RecordSource`` is where records come from. ``FileSource`` reads the state directory; a source
reading a running server's admin API (``/decisions?...``, built from ``Query.to_params``) can
implement the same two methods, and the CLI does not change.
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

_DURATION = re.compile(r"^\s*(\d+)\s*(s|m|h|d|w)\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}

Record = dict[str, Any]


def parse_since(text: str) -> timedelta | datetime:
    """``10m``, ``2h``, ``1d`` (ago) or an ISO-8601 time (UTC when no offset is given)."""
    match = _DURATION.match(text)
    if match:
        return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"cannot read {text!r} as a time: use a duration such as 30s, 10m, 2h, 1d "
            f"or an ISO-8601 time such as 2024-05-01T16:00:00Z"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def since_cutoff(since: timedelta | datetime, now: datetime) -> datetime:
    return now - since if isinstance(since, timedelta) else since


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


def _complete_lines(path: Path, offset: int) -> tuple[list[Record], int]:
    """Records in whole lines from ``offset``; returns them and the offset after the last one."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read()
    end = data.rfind(b"\n") + 1
    records = [rec for rec in map(parse_line, data[:end].splitlines()) if rec is not None]
    return records, offset + end


def iter_records(state_dir: Path) -> Iterator[Record]:
    """Every record, oldest first, across rotated files; torn lines are skipped."""
    for path in log_files(state_dir):
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # rotated away while we listed
            continue
        for line in data.splitlines():
            record = parse_line(line)
            if record is not None:
                yield record


class RecordSource(Protocol):
    def query(self, query: Query) -> list[Record]: ...

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
        return select(iter_records(self.state_dir), query)

    def _rotated_since(self, inode: int, offset: int) -> list[Record]:
        """After rotation: the rest of the file we were reading, then any newer rotated file."""
        rotated = [path for path in log_files(self.state_dir) if path.name != CURRENT]
        try:
            inodes = [path.stat().st_ino for path in rotated]
            if inode not in inodes:
                return []
            start = inodes.index(inode)
            records = _complete_lines(rotated[start], offset)[0]
            for path in rotated[start + 1:]:
                records += _complete_lines(path, 0)[0]
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
                records, offset = _complete_lines(current, offset)
                fresh += records
            for record in fresh:
                if record["seq"] > last:
                    last = record["seq"]
                    if query.matches(record):
                        yield record
            time.sleep(poll_s)
