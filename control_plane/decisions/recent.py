"""Bounded reads for faces that render on request (the dashboard): the newest matching records
of a range under a byte cap, and one record by seq.

Both stand on `scan.LogView` (the log is its own index): a range's start is found by bisection
on time, a seq by bisection on seq. ``newest`` then walks the range backwards from the end and
stops at the first of: the range's start, ``query.limit`` matches, or ``max_bytes`` read — then
the answer says ``truncated`` (older matches may exist). Lines are pre-filtered on their bytes
(``"pop":"ewr"``, as the writer spells them) before any JSON is parsed, so a sparse filter over a
wide range costs a scan of bytes, not a parse of every record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from control_plane.decisions.log import parse_line
from control_plane.decisions.read import Query, Record, record_time
from control_plane.decisions.scan import LogView

DEFAULT_MAX_BYTES = 16 * 1024 * 1024
START = (0, 0)


@dataclass(frozen=True)
class Window:
    """Matching records, oldest first. ``truncated``: the byte cap ended the scan early;
    ``exhausted``: the scan reached the oldest record the log keeps."""

    records: list[Record]
    truncated: bool
    scanned_bytes: int
    exhausted: bool = False


def _spelled(name: str, value: str) -> bytes:
    """How the writer spells ``"name":value`` inside a line (compact separators, UTF-8)."""
    return f'"{name}":{json.dumps(value, ensure_ascii=False)}'.encode()


def newest(state_dir: Path, query: Query, max_bytes: int = DEFAULT_MAX_BYTES) -> Window:
    """The newest records matching ``query`` (``limit`` of them at most), oldest first."""
    needles = [_spelled(name, value) for name, value in (("pop", query.pop),
                                                         ("group", query.group)) if value]
    kinds = [_spelled("kind", kind) for kind in sorted(query.kinds)]
    since = query.since
    found: list[Record] = []
    scanned = 0
    with LogView(state_dir) as view:
        stop = START if since is None else view.first(lambda r: record_time(r) >= since)
        for _, line in view.backward(stop):
            scanned += len(line)
            if scanned > max_bytes:
                return Window(found[::-1], True, scanned)
            if any(needle not in line for needle in needles):
                continue
            if kinds and not any(kind in line for kind in kinds):
                continue
            record = parse_line(line)
            if record is None or not query.matches(record):
                continue
            found.append(record)
            if query.limit is not None and len(found) >= query.limit:
                return Window(found[::-1], False, scanned)
    return Window(found[::-1], False, scanned, exhausted=stop == START)


def by_seq(state_dir: Path, seq: int) -> Record | None:
    """The record with this seq, or None when it is not (or no longer) in the log."""
    with LogView(state_dir) as view:
        for _, record in view.records(view.first(lambda r: r["seq"] >= seq)):
            return record if record["seq"] == seq else None
    return None
