"""The desired-state watcher hands over complete contents once, whatever way editors save.

On a fake clock: time moves only when a test advances it, so every step is exact and no test
sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from control_plane.reload.file_watcher import DesiredFileWatcher
from tests.support.fake_clock import FakeClock

POLL, SETTLE = 0.05, 0.5


@asynccontextmanager
async def _watching(
    tmp_path: Path,
) -> AsyncIterator[tuple[Path, list[bytes], DesiredFileWatcher, FakeClock]]:
    """A watcher on `desired.yaml` (starting as `a: 1`), waiting for its next poll: the path,
    what it handed over, itself and its clock."""
    path = tmp_path / "desired.yaml"
    path.write_bytes(b"a: 1\n")
    seen: list[bytes] = []

    async def on_change(data: bytes) -> None:
        seen.append(data)

    clock = FakeClock()
    watcher = DesiredFileWatcher(
        path, on_change, poll=POLL, settle=SETTLE, current=path.read_bytes(), sleep=clock.sleep
    )
    task = asyncio.create_task(watcher.run())
    await clock.idle()
    try:
        yield path, seen, watcher, clock
    finally:
        task.cancel()


async def _next_pass(clock: FakeClock, *seconds: float) -> None:
    """Advance by each of `seconds`, then let the watcher finish and wait again."""
    for step in seconds:
        await clock.advance(step)
    await clock.idle()


async def test_in_place_rewrite_hands_over_only_the_settled_file(tmp_path: Path) -> None:
    async with _watching(tmp_path) as (path, seen, _, clock):
        with open(path, "wb") as f:  # an editor writing in two chunks
            f.write(b"a: 2\nb:")
            f.flush()
            await clock.advance(POLL)  # seen changing: it waits for the file to settle
            f.write(b" 3\n")
        await clock.advance(SETTLE)  # changed again meanwhile: it waits once more
        assert seen == []
        await _next_pass(clock, SETTLE)
        assert seen == [b"a: 2\nb: 3\n"]


async def test_rename_over_and_unchanged_touch(tmp_path: Path) -> None:
    async with _watching(tmp_path) as (path, seen, watcher, clock):
        tmp = tmp_path / ".desired.yaml.swp"
        tmp.write_bytes(b"a: 9\n")
        os.replace(tmp, path)
        await _next_pass(clock, POLL, SETTLE)
        assert seen == [b"a: 9\n"]
        os.utime(path, ns=(1, 1))  # same bytes, new mtime: nothing to hand over
        await _next_pass(clock, POLL, SETTLE)
        await _next_pass(clock, POLL, SETTLE)
        assert seen == [b"a: 9\n"]
        watcher.trigger()  # SIGHUP forces a re-read, before the next poll
        await _next_pass(clock, SETTLE)
        assert seen == [b"a: 9\n", b"a: 9\n"]


async def test_missing_file_is_waited_out(tmp_path: Path) -> None:
    async with _watching(tmp_path) as (path, seen, _, clock):
        path.unlink()
        await _next_pass(clock, POLL, SETTLE)
        assert seen == []
        path.write_bytes(b"a: 22\n")
        await _next_pass(clock, POLL, SETTLE)
        assert seen == [b"a: 22\n"]


async def test_a_read_that_failed_for_want_of_descriptors_is_retried(tmp_path: Path) -> None:
    """With the process out of descriptors ("Too many open files") the edit could not be read,
    and once descriptors were free again it was never applied: the file had not changed since.
    Now an unreadable file is read again at every poll, and reported once."""
    async with _watching(tmp_path) as (path, seen, watcher, clock):
        unreadable: list[str] = []
        watcher.on_unreadable = lambda err: unreadable.append(str(err))
        path.write_bytes(b"a: 5\n")
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        held: list[int] = []
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, hard))
        try:
            with contextlib.suppress(OSError):  # every descriptor taken: EMFILE
                while True:
                    held.append(os.open(os.devnull, os.O_RDONLY))
            await _next_pass(clock, POLL, SETTLE)
            await _next_pass(clock, POLL, SETTLE)
        finally:
            for fd in held:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert seen == []
        assert len(unreadable) == 1 and "Too many open files" in unreadable[0], unreadable
        await _next_pass(clock, POLL, SETTLE)  # descriptors again: read, and handed over
        assert seen == [b"a: 5\n"]
