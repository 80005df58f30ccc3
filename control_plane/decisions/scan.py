"""Reading the decision log with bounded memory, without parsing what a query does not need.

The log is its own index: `seq` grows by one per record along the files (oldest rotated file
first), and `time` grows with it (the writer's clock). So a query does not parse the whole log:

- `since` and `after` (seq) find their first record by bisecting byte offsets — the first record
  of each file, then within one file — reading O(log size) lines;
- `limit` (the newest N matching) scans lines backwards from the end, keeping only a count and a
  position, then streams forward from that position;
- records are then yielded one at a time, so memory stays at one line whatever the answer's size.

A `LogView` opens every file once, with its size at that moment: records appended or files
rotated while a query runs change nothing in its answer. Lines longer than `MAX_LINE_BYTES`
(a record no current writer produces) and torn lines are skipped, like foreign lines.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from control_plane.decisions.log import CURRENT, log_files, parse_line

Record = dict[str, Any]
Position = tuple[int, int]  # (file index in the view, byte offset of a line's start)
MAX_LINE_BYTES = 256 * 1024
BLOCK = 64 * 1024


class LogView:
    """The log files as they were when opened (oldest first); use as a context manager.

    One reader at a time: the line iterators share the open files' positions."""

    def __init__(self, state_dir: Path) -> None:
        self._handles: list[IO[bytes]] = []
        self._sizes: list[int] = []
        self._current: tuple[int, int] | None = None  # (inode, size) of decisions.jsonl
        for path in log_files(state_dir):
            try:
                handle = open(path, "rb")  # noqa: SIM115 - closed by close()
            except FileNotFoundError:  # rotated away while we listed
                continue
            status = os.fstat(handle.fileno())
            self._handles.append(handle)
            self._sizes.append(status.st_size)
            if path.name == CURRENT:
                self._current = (status.st_ino, status.st_size)

    def __enter__(self) -> LogView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for handle in self._handles:
            handle.close()
        self._handles.clear()
        self._sizes.clear()

    @property
    def end(self) -> Position:
        return (len(self._handles), 0)

    def in_current(self, at: Position) -> tuple[int, int] | None:
        """(inode, byte offset) of `at` in the current file (`decisions.jsonl`), if it is there
        or at the end of the view; None when it is in a rotated file."""
        if self._current is None:
            return None
        last = len(self._handles) - 1
        if at == self.end:
            return self._current
        return (self._current[0], at[1]) if at[0] == last else None

    # -- lines --------------------------------------------------------------------------------

    def forward(self, start: Position = (0, 0)) -> Iterator[tuple[Position, bytes]]:
        """Complete lines from `start` to the end of the view, with where each starts."""
        for index in range(start[0], len(self._handles)):
            handle, size = self._handles[index], self._sizes[index]
            offset = start[1] if index == start[0] else 0
            handle.seek(offset)
            while offset < size:
                at = offset
                line = handle.readline(min(MAX_LINE_BYTES + 1, size - offset))
                if not line:
                    break
                offset += len(line)
                if line.endswith(b"\n"):
                    yield (index, at), line
                    continue
                # too long (or torn at the end): skip to the end of the line
                while offset < size and not line.endswith(b"\n"):
                    line = handle.readline(min(BLOCK, size - offset))
                    if not line:
                        break
                    offset += len(line)

    def backward(self, stop: Position = (0, 0)) -> Iterator[tuple[Position, bytes]]:
        """Complete lines from the end back to `stop`, newest first."""
        for index in range(len(self._handles) - 1, stop[0] - 1, -1):
            low = stop[1] if index == stop[0] else 0
            yield from self._backward_in(index, low)

    def _backward_in(self, index: int, low: int) -> Iterator[tuple[Position, bytes]]:
        handle = self._handles[index]
        pos = self._sizes[index]
        buf = b""  # bytes [pos, pos + len(buf)): not yet yielded
        skipping = False  # inside a line too long to keep: looking for its start
        while pos > low or buf:
            cut = buf.rfind(b"\n", 0, len(buf) - 1) if buf else -1
            while cut < 0 and pos > low:
                read_from = max(low, pos - BLOCK)
                handle.seek(read_from)
                block = handle.read(pos - read_from)
                pos = read_from
                if skipping:
                    cut = block.rfind(b"\n")
                    if cut >= 0:
                        buf, skipping = block[: cut + 1], False
                        cut = buf.rfind(b"\n", 0, len(buf) - 1)
                    continue
                buf = block + buf
                cut = buf.rfind(b"\n", 0, len(buf) - 1)
                if cut < 0 and len(buf) > MAX_LINE_BYTES:
                    buf, skipping = b"", True
            if skipping:
                return  # the region starts inside an over-long line: nothing more
            line, at = (buf[cut + 1:], pos + cut + 1) if cut >= 0 else (buf, pos)
            buf = buf[: cut + 1] if cut >= 0 else b""
            if line.endswith(b"\n") and len(line) <= MAX_LINE_BYTES + 1:
                yield (index, at), line

    # -- positions ----------------------------------------------------------------------------

    def records(self, start: Position = (0, 0)) -> Iterator[tuple[Position, Record]]:
        for at, line in self.forward(start):
            record = parse_line(line)
            if record is not None:
                yield at, record

    def _first_in(self, index: int, low: int = 0) -> tuple[Position, Record] | None:
        """The first record starting at or after byte `low` of file `index` (same file only)."""
        for at, record in self.records((index, low)):
            if at[0] != index:
                return None
            return at, record
        return None

    def first(self, reached: Callable[[Record], bool]) -> Position:
        """Where the first record for which `reached` holds starts (`reached` must be False
        then True along the log, e.g. seq > N or time >= T); `end` when there is none."""
        for index in range(len(self._handles) - 1, -1, -1):
            head = self._first_in(index)
            if head is None:
                continue
            if reached(head[1]):
                if index == 0:
                    return head[0]
                continue
            return self._bisect(index, head[0][1], reached)
        return (0, 0)

    def _bisect(self, index: int, lo: int, reached: Callable[[Record], bool]) -> Position:
        """Within file `index`, whose record at `lo` is not `reached`: the first that is."""
        hi = self._sizes[index]
        while hi - lo > BLOCK:
            mid = (lo + hi) // 2
            found = self._after_newline(index, mid)
            if found is None or found[0][1] >= hi:
                hi = mid
            elif reached(found[1]):
                hi = found[0][1]
            else:
                lo = found[0][1]
        for at, record in self.records((index, lo)):
            if reached(record):
                return at
        return (index + 1, 0)

    def _after_newline(self, index: int, offset: int) -> tuple[Position, Record] | None:
        """The first record of file `index` starting after the newline at or after `offset`."""
        handle, size = self._handles[index], self._sizes[index]
        handle.seek(offset - 1)
        at = offset - 1
        while at < size:
            chunk = handle.readline(min(BLOCK, size - at))
            if not chunk:
                return None
            at += len(chunk)
            if chunk.endswith(b"\n"):
                return self._first_in(index, at) if at < size else None
        return None

    def newest(
        self, matches: Callable[[Record], bool], count: int, stop: Position = (0, 0)
    ) -> Position:
        """Where the `count`-th newest record matching `matches` (after `stop`) starts;
        `stop` when fewer match."""
        found = 0
        for at, line in self.backward(stop):
            record = parse_line(line)
            if record is not None and matches(record):
                found += 1
                if found == count:
                    return at
        return stop
