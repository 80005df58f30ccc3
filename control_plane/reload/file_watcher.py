"""Watch the desired-state file and hand over complete new contents, never a half-written file.

Editors save in two ways: rewrite in place (the file is briefly truncated or partial) or write a
temp file and rename it over the original. Both are covered by polling the file's identity
(inode, size, mtime) and only reading it once that identity has stayed the same for `settle`
seconds; the bytes are then handed over only if their hash differs from the last ones handed
over. Whatever is handed over still goes through full validation before anything applies.
SIGHUP (via `trigger`) forces a re-read even if nothing seems to have changed. The files the
desired state names (`also`: TLS listeners' certificates and keys) are watched the same way: a
change in one hands the desired state over again, unchanged, so it is read with the new files
(a certificate renewal); a pair caught half-written fails validation and the running one stays.
Time passes through the injected `sleep` (asyncio's by default; tests give a fake clock's).

The watcher survives anything: a file that cannot be read as a desired state (not a regular
file, too large, or no descriptor left: "Too many open files") goes to `on_unreadable` with the
reason — once per distinct reason — and is read again at every poll until it can be, so an edit
made while the process was out of descriptors applies once it has them again; any exception
while handing over is logged and goes to `on_error`; the next change (or SIGHUP) is handled as
usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from control_plane.desired import DesiredStateError, read_desired_bytes

log = logging.getLogger(__name__)

FileIdentity = tuple[int, int, int]  # inode, size, mtime_ns


def identity(path: Path) -> FileIdentity | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class DesiredFileWatcher:
    def __init__(
        self,
        path: Path,
        on_change: Callable[[bytes], Awaitable[object]],
        *,
        poll: float = 0.25,
        settle: float = 0.3,
        current: bytes | None = None,
        on_unreadable: Callable[[DesiredStateError], None] | None = None,
        on_error: Callable[[Exception], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        also: Callable[[], tuple[str, ...]] = tuple,
    ) -> None:
        self.path = path
        self.also = also
        self.on_change = on_change
        self.on_unreadable = on_unreadable
        self.on_error = on_error
        self.poll = poll
        self.settle = settle
        self._sleep = sleep
        self._seen = self._identities()
        self._handed_hash = hashlib.sha256(current).hexdigest() if current is not None else None
        self._forced = asyncio.Event()
        self._unreadable: str | None = None  # why the last read failed (reported once)

    def trigger(self) -> None:
        """Re-read now (SIGHUP)."""
        self._forced.set()

    async def run(self) -> None:
        while True:
            await self._poll_or_trigger()
            forced = self._forced.is_set()
            self._forced.clear()
            try:
                await self._check(forced)
            except Exception as err:  # never let one bad pass end hot reload
                log.exception("desired-state watcher: handling %s failed", self.path)
                if self.on_error is not None:
                    with contextlib.suppress(Exception):
                        self.on_error(err)

    async def _poll_or_trigger(self) -> None:
        """Back after `poll` seconds, or as soon as `trigger` is called."""
        if self._forced.is_set():
            return
        waits = [asyncio.ensure_future(self._sleep(self.poll)),
                 asyncio.ensure_future(self._forced.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    def _identities(self) -> tuple[FileIdentity | None, ...]:
        """The desired-state file's identity, then those of the files it names (`also`)."""
        return (identity(self.path), *(identity(Path(p)) for p in self.also()))

    async def _check(self, forced: bool) -> None:
        now = self._identities()
        if now[0] is None or (now == self._seen and not forced and self._unreadable is None):
            return
        stable = await self._wait_stable(now)
        if stable is None:
            return
        named_changed = stable[1:] != self._seen[1:]
        self._seen = stable
        await self._hand_over(forced or named_changed)

    async def _wait_stable(
        self, first: tuple[FileIdentity | None, ...]
    ) -> tuple[FileIdentity | None, ...] | None:
        previous = first
        while True:
            await self._sleep(self.settle)
            now = self._identities()
            if now[0] is None:
                return None
            if now == previous:
                return now
            previous = now

    async def _hand_over(self, forced: bool) -> None:
        try:
            data = await asyncio.to_thread(read_desired_bytes, self.path)
        except DesiredStateError as err:
            self._handed_hash = None  # a readable file again is handed over, even if unchanged
            if str(err) != self._unreadable:  # read again every poll, reported once
                self._unreadable = str(err)
                log.warning("cannot read %s: %s", self.path, err)
                if self.on_unreadable is not None:
                    self.on_unreadable(err)
            return
        self._unreadable = None
        digest = hashlib.sha256(data).hexdigest()
        if digest == self._handed_hash and not forced:
            return
        self._handed_hash = digest
        await self.on_change(data)
