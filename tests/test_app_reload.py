"""The desired-state watcher hands over complete contents once, whatever way editors save."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from control_plane.app.reload import DesiredFileWatcher

SETTLE = 0.5  # well above the editor's pause below, even on a loaded machine


async def _handed_over(seen: list[bytes], count: int, timeout: float = 5.0) -> None:
    """Wait until `count` contents were handed over, then long enough for a wrong extra one."""
    deadline = asyncio.get_running_loop().time() + timeout
    while len(seen) < count and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(SETTLE * 3)


@asynccontextmanager
async def _watching(
    tmp_path: Path,
) -> AsyncIterator[tuple[Path, list[bytes], DesiredFileWatcher]]:
    """A watcher on `desired.yaml` (starting as `a: 1`): the path, what it handed over, itself."""
    path = tmp_path / "desired.yaml"
    path.write_bytes(b"a: 1\n")
    seen: list[bytes] = []

    async def on_change(data: bytes) -> None:
        seen.append(data)

    watcher = DesiredFileWatcher(
        path, on_change, poll=0.05, settle=SETTLE, current=path.read_bytes()
    )
    task = asyncio.create_task(watcher.run())
    try:
        yield path, seen, watcher
    finally:
        task.cancel()


async def test_in_place_rewrite_hands_over_only_the_settled_file(tmp_path: Path) -> None:
    async with _watching(tmp_path) as (path, seen, _):
        with open(path, "wb") as f:  # an editor writing in two chunks
            f.write(b"a: 2\nb:")
            f.flush()
            os.fsync(f.fileno())
            await asyncio.sleep(0.1)
            f.write(b" 3\n")
        await _handed_over(seen, 1)
        assert seen == [b"a: 2\nb: 3\n"]


async def test_rename_over_and_unchanged_touch(tmp_path: Path) -> None:
    async with _watching(tmp_path) as (path, seen, watcher):
        tmp = tmp_path / ".desired.yaml.swp"
        tmp.write_bytes(b"a: 9\n")
        os.replace(tmp, path)
        await _handed_over(seen, 1)
        assert seen == [b"a: 9\n"]
        os.utime(path)  # same bytes, new mtime: nothing to hand over
        await _handed_over(seen, 2, timeout=0)
        assert seen == [b"a: 9\n"]
        watcher.trigger()  # SIGHUP forces a re-read
        await _handed_over(seen, 2)
        assert seen == [b"a: 9\n", b"a: 9\n"]


async def test_missing_file_is_waited_out(tmp_path: Path) -> None:
    async with _watching(tmp_path) as (path, seen, _):
        path.unlink()
        await asyncio.sleep(SETTLE)
        path.write_bytes(b"a: 2\n")
        await _handed_over(seen, 1)
        assert seen == [b"a: 2\n"]
