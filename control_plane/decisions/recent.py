"""Bounded reads of the decision log: the newest matching records, and one record by seq.

Both read from the end of the log (or bisect it), never the whole of it: the dashboard and any
other face that renders on request must cost what the answer costs, not what the log holds.

- ``newest`` walks the files newest first, each backwards in blocks, and stops at the first of:
  a record older than ``query.since`` (records are appended in time order), ``query.limit``
  matches, or ``max_bytes`` read — then the answer says ``truncated`` (older matches may exist).
  Lines are pre-filtered on their bytes (``"pop":"ewr"``, as the writer spells them) before any
  JSON is parsed, and the time is read from the line's fixed prefix.
- ``by_seq`` finds one record by bisecting the file that holds it on byte offsets: seq grows by
  one per record, so a few short reads of one file find it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from control_plane.decisions.log import format_time, log_files, parse_line
from control_plane.decisions.read import Query, Record

BLOCK = 256 * 1024
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
_TIME_PREFIX = b'{"time":"'
_TIME_LEN = len("2024-05-01T16:02:10.123Z")


@dataclass(frozen=True)
class Window:
    """Matching records, oldest first. ``truncated``: the byte budget ended the scan early;
    ``exhausted``: the scan reached the oldest record the log keeps."""

    records: list[Record]
    truncated: bool
    scanned_bytes: int
    exhausted: bool = False


def _spelled(name: str, value: str) -> bytes:
    """How the writer spells ``"name":value`` inside a line (compact separators, UTF-8)."""
    return f'"{name}":{json.dumps(value, ensure_ascii=False)}'.encode()


def _needles(query: Query) -> list[bytes]:
    return [_spelled(name, value) for name, value in (("pop", query.pop), ("group", query.group))
            if value is not None]


def _older(line: bytes, since: bytes) -> bool:
    """The line's time (its fixed prefix, compared as bytes) is before ``since``."""
    start = len(_TIME_PREFIX)
    return line.startswith(_TIME_PREFIX) and line[start:start + _TIME_LEN] < since


def _lines_backwards(path: Path) -> Iterator[tuple[bytes, int]]:
    """Complete lines of one file, last first, each with the bytes read so far."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed below, generator may stop early
    except FileNotFoundError:  # rotated away while we listed
        return
    with handle:
        position = os.fstat(handle.fileno()).st_size
        carry = b""
        read = 0
        while position > 0:
            size = min(BLOCK, position)
            position -= size
            handle.seek(position)
            block = handle.read(size) + carry
            read += size
            lines = block.split(b"\n")
            carry = lines[0]  # may continue in the previous block
            for line in reversed(lines[1:]):
                if line:
                    yield line, read
        if carry:
            yield carry, read


def newest(state_dir: Path, query: Query, max_bytes: int = DEFAULT_MAX_BYTES) -> Window:
    """The newest records matching ``query`` (``limit`` of them at most), oldest first."""
    needles = _needles(query)
    kinds = [_spelled("kind", kind) for kind in sorted(query.kinds)]
    since = format_time(query.since).encode() if query.since is not None else None
    found: list[Record] = []
    scanned = 0
    for path in reversed(log_files(state_dir)):
        file_read = 0
        for line, file_read in _lines_backwards(path):
            if scanned + file_read > max_bytes:
                return Window(found[::-1], True, scanned + file_read)
            if since is not None and _older(line, since):
                return Window(found[::-1], False, scanned + file_read)
            if any(needle not in line for needle in needles):
                continue
            if kinds and not any(kind in line for kind in kinds):
                continue
            record = parse_line(line)
            if record is None or not query.matches(record):
                continue
            found.append(record)
            if query.limit is not None and len(found) >= query.limit:
                return Window(found[::-1], False, scanned + file_read)
        scanned += file_read
    return Window(found[::-1], False, scanned, exhausted=True)


def _seq_at(handle: BinaryIO, offset: int) -> tuple[int | None, int]:
    """The seq of the first complete line starting after ``offset`` and that line's start."""
    handle.seek(offset)
    if offset:
        handle.readline()  # the rest of a line that started before offset
    start = handle.tell()
    while True:
        line = handle.readline()
        if not line:
            return None, start
        record = parse_line(line)
        if record is not None:
            return int(record["seq"]), start
        start = handle.tell()


def _first_seq(path: Path) -> int | None:
    try:
        with open(path, "rb") as handle:
            return _seq_at(handle, 0)[0]
    except FileNotFoundError:
        return None


def by_seq(state_dir: Path, seq: int) -> Record | None:
    """The record with this seq, or None when it is not (or no longer) in the log."""
    for path in reversed(log_files(state_dir)):
        first = _first_seq(path)
        if first is None or first > seq:
            continue
        with open(path, "rb") as handle:
            low, high = 0, os.fstat(handle.fileno()).st_size
            while high - low > BLOCK:
                middle = (low + high) // 2
                found, _ = _seq_at(handle, middle)
                if found is not None and found <= seq:
                    low = middle
                else:
                    high = middle
            handle.seek(low)
            if low:
                handle.readline()
            for line in handle:
                record = parse_line(line)
                if record is None:
                    continue
                if record["seq"] == seq:
                    return record
                if record["seq"] > seq:
                    return None
        return None
    return None
