"""The append-only decision log: JSON Lines in the state directory, one fsync'd record per decision.

Files: ``decisions.jsonl`` (current), ``decisions.1.jsonl`` (previous) ... ``decisions.N.jsonl``
(oldest kept). A record is written with a single ``write`` and ``fsync`` before ``record`` returns,
so after ``kill -9`` at most the line being written is torn; readers skip it and the writer starts
a fresh line after it. Records of routine events (a node connecting) may be written with
``durable=False``: no fsync of their own, made durable by the next durable record, by ``sync()``
(the server calls it every second) or by ``close()`` — so a reconnect storm of thousands of
Envoys does not cost thousands of fsyncs on the event loop. ``seq`` continues across
restarts: the writer reads the last one on open.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from control_plane.decisions.kinds import KINDS

CURRENT = "decisions.jsonl"
DEFAULT_MAX_BYTES = 10 * 1024 * 1024
DEFAULT_KEEP = 5
FIELDS: tuple[str, ...] = (
    "pop",
    "group",
    "weights_before",
    "weights_after",
    "inputs",
    "rule",
    "config_version",
    "detail",
)

Clock = Callable[[], datetime]
Listener = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Draft:
    """A decision record checked and serialized ahead of its writing — everything but its time
    and seq — so the work can happen off the event loop (`draft`, then `write_drafts`)."""

    kind: str
    fields: dict[str, Any]  # every name of FIELDS, None where not given
    body: str  # the fields as JSON members, without the braces


def draft(kind: str, **fields: Any) -> Draft:
    """A record of `kind` made ready to write. Unknown kinds (ValueError) or fields (TypeError)
    raise."""
    if kind not in KINDS:
        raise ValueError(f"unknown decision kind {kind!r}; known: {', '.join(KINDS)}")
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise TypeError(f"unknown decision record fields: {', '.join(sorted(unknown))}")
    full = {name: fields.get(name) for name in FIELDS}
    return Draft(kind, full, _members(full))


def _members(values: dict[str, Any]) -> str:
    """`values` as the members of a JSON object (the log's compact encoding)."""
    return json.dumps(values, separators=(",", ":"), ensure_ascii=False)[1:-1]


def rotated_name(index: int) -> str:
    return f"decisions.{index}.jsonl"


def log_files(state_dir: Path) -> list[Path]:
    """Existing log files, oldest first."""
    rotated = sorted(
        (
            (int(path.name.split(".")[1]), path)
            for path in state_dir.glob("decisions.*.jsonl")
            if path.name.split(".")[1].isdigit()
        ),
        reverse=True,
    )
    files = [path for _, path in rotated]
    current = state_dir / CURRENT
    if current.exists():
        files.append(current)
    return files


def format_time(moment: datetime) -> str:
    """ISO-8601 UTC with milliseconds: ``2024-05-01T16:02:10.123Z``."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_line(line: bytes) -> dict[str, Any] | None:
    """A record from one line, or None for a torn or foreign line (also: no integer seq, or a
    time that is not an ISO-8601 time with an offset, so readers can rely on both)."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # undecodable, not JSON, nested or numbers too deep
        return None
    if not isinstance(record, dict) or type(record.get("seq")) is not int:
        return None
    moment = record.get("time")
    if not isinstance(moment, str):
        return None
    try:
        parsed = datetime.fromisoformat(moment.replace("Z", "+00:00"))
    except ValueError:
        return None
    return record if parsed.tzinfo is not None else None


def check_replicated(record: dict[str, Any]) -> None:
    """ValueError unless `record` is one another replica wrote (a known kind, its replica)."""
    if record.get("kind") not in KINDS or not isinstance(record.get("replica"), str):
        raise ValueError(f"not a replicated decision record: {str(record)[:200]}")


def _last_seq(path: Path) -> int | None:
    for line in reversed(path.read_bytes().splitlines()):
        record = parse_line(line)
        if record is not None:
            return int(record["seq"])
    return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Lines:
    """Records made ahead (`Draft`s) as the log's lines, with their time and the seqs that follow
    `after`, and the records as written (for the log's listeners). `made()` does the work once,
    on whichever thread calls it first: it reads nothing of the log."""

    def __init__(self, drafts: Sequence[Draft], stamp: str, after: int,
                 origin: dict[str, Any]) -> None:
        self.drafts = drafts
        self.stamp = stamp
        self.after = after  # the log's seq when they were made
        self.origin = origin
        self._made: tuple[bytes, list[dict[str, Any]]] | None = None

    def made(self) -> tuple[bytes, list[dict[str, Any]]]:
        if self._made is None:
            time = json.dumps(self.stamp)
            origin = self.origin
            tail = f",{_members(origin)}" if origin else ""
            lines: list[str] = []
            records: list[dict[str, Any]] = []
            seq = self.after
            for made in self.drafts:
                seq += 1
                lines.append(
                    f'{{"time":{time},"seq":{seq},"kind":"{made.kind}",{made.body}{tail}}}\n')
                records.append({"time": self.stamp, "seq": seq, "kind": made.kind,
                                **made.fields, **origin})
            self._made = ("".join(lines).encode(), records)
        return self._made


class DecisionLog:
    """Writer. ``record(kind, **fields)`` appends one record durably and returns it."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        keep: int = DEFAULT_KEEP,
        clock: Clock | None = None,
    ) -> None:
        if max_bytes < 1 or keep < 1:
            raise ValueError("max_bytes and keep must be at least 1")
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / CURRENT
        self.max_bytes = max_bytes
        self.keep = keep
        self._clock: Clock = clock or (lambda: datetime.now(UTC))
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.seq = next(
            (seq for seq in map(_last_seq, reversed(log_files(self.state_dir))) if seq is not None),
            0,
        )
        self._dirty = False  # written but not yet fsync'd
        self._listeners: list[Listener] = []
        self._fd = self._open()
        # With replicas: {"replica": id, "term": n} stamped on every record written here.
        self.origin: dict[str, Any] = {}

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(record)`` after each record is written (e.g. a live stream's feed)."""
        self._listeners.append(listener)

    def _open(self) -> int:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        size = os.fstat(fd).st_size
        if size:
            with open(self.path, "rb") as current:
                current.seek(size - 1)
                torn = current.read(1) != b"\n"
            if torn:
                os.write(fd, b"\n")
                os.fsync(fd)
        _fsync_dir(self.state_dir)
        return fd

    def _rotate(self) -> None:
        self.sync()
        os.close(self._fd)
        oldest = self.state_dir / rotated_name(self.keep)
        oldest.unlink(missing_ok=True)
        for index in range(self.keep - 1, 0, -1):
            source = self.state_dir / rotated_name(index)
            if source.exists():
                source.rename(self.state_dir / rotated_name(index + 1))
        self.path.rename(self.state_dir / rotated_name(1))
        self._fd = self._open()

    def record(self, kind: str, *, durable: bool = True, **fields: Any) -> dict[str, Any]:
        """Append one decision; returns the record as written. Unknown kinds or fields raise.

        `durable=False`: written now, fsync'd with the next durable record or `sync()`.
        """
        return self.write_drafts([draft(kind, **fields)], durable=durable)[0]

    def write_drafts(self, drafts: Sequence[Draft], *, durable: bool = True
                     ) -> list[dict[str, Any]]:
        """Append records made ahead (`draft`), with one time, in one write (all or none of them
        are in the log after it: a failed write is taken back); returns them as written."""
        if not drafts:
            return []
        return self.append_lines(self.lines(drafts), durable=durable)

    def lines(self, drafts: Sequence[Draft]) -> Lines:
        """`drafts` as the lines the log would append now (`append_lines`): the work of a
        write, done where it is cheapest (`Lines.make` runs on any thread)."""
        return Lines(drafts, format_time(self._clock()), self.seq, dict(self.origin))

    def append_lines(self, lines: Lines, *, durable: bool = True) -> list[dict[str, Any]]:
        """Append lines made by `lines` (made if not yet) in one write; nothing may have been
        written since they were made (their seqs follow the log's). Returns the records."""
        assert lines.after == self.seq, f"lines made after seq {lines.after}, log at {self.seq}"
        data, records = lines.made()
        self._write(data, len(records), durable)
        for record in records:
            self._tell(record)
        return records

    def append_replicated(self, record: dict[str, Any], *, durable: bool = True) -> dict[str, Any]:
        """Append a record another replica wrote (its time, kind, fields, replica and term kept;
        ``seq`` is this log's own). Records of unknown kinds or without a replica are refused."""
        check_replicated(record)
        copy = {
            "time": str(record.get("time", "")),
            "seq": self.seq + 1,
            "kind": record["kind"],
            **{name: record.get(name) for name in FIELDS},
            "replica": record["replica"],
            **({"term": record["term"]} if type(record.get("term")) is int else {}),
        }
        self._append(copy, durable)
        self._tell(copy)
        return copy

    def _append(self, record: dict[str, Any], durable: bool) -> None:
        line = (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
        self._write(line, 1, durable)

    def _write(self, data: bytes, count: int, durable: bool) -> None:
        """Append `count` whole lines in one write (rotating first when they would not fit)."""
        before = os.fstat(self._fd).st_size
        if before and before + len(data) > self.max_bytes:
            self._rotate()
            before = os.fstat(self._fd).st_size
        try:
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, f"short write to {self.path}: {written} of "
                              f"{len(data)} bytes")
        except OSError:
            # a full disk: take back what part of the lines got in, so the next record (once
            # there is space) starts a line of its own; nothing is counted as written
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, before)
            raise
        self.seq += count
        if durable:
            os.fsync(self._fd)  # also covers every earlier non-durable line
            self._dirty = False
        else:
            self._dirty = True

    def _tell(self, record: dict[str, Any]) -> None:
        for listener in self._listeners:
            listener(record)

    def sync(self) -> None:
        """Make the records written with `durable=False` durable."""
        if self._dirty and self._fd >= 0:
            os.fsync(self._fd)
            self._dirty = False

    async def sync_in_thread(self) -> None:
        """`sync()` with the fsync on a worker thread, so the event loop keeps serving while the
        disk works; records written meanwhile are left to the next sync."""
        if not self._dirty or self._fd < 0:
            return
        fd = os.dup(self._fd)  # a rotation meanwhile closes the log's descriptor, not this one
        self._dirty = False
        try:
            await asyncio.to_thread(os.fsync, fd)
        except BaseException:
            self._dirty = True
            raise
        finally:
            os.close(fd)

    def close(self) -> None:
        if self._fd >= 0:
            self.sync()
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> DecisionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
