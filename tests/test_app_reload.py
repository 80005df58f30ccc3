"""The desired-state watcher hands over complete contents once, whatever way editors save."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from control_plane.app.reload import DesiredFileWatcher


async def _watch(path: Path, seen: list[bytes]) -> tuple[DesiredFileWatcher, asyncio.Task[None]]:
    async def on_change(data: bytes) -> None:
        seen.append(data)

    watcher = DesiredFileWatcher(path, on_change, poll=0.05, settle=0.2, current=path.read_bytes())
    return watcher, asyncio.create_task(watcher.run())


async def test_in_place_rewrite_hands_over_only_the_settled_file(tmp_path: Path) -> None:
    path = tmp_path / "desired.yaml"
    path.write_bytes(b"a: 1\n")
    seen: list[bytes] = []
    _watcher, task = await _watch(path, seen)
    try:
        with open(path, "wb") as f:  # an editor writing in two chunks
            f.write(b"a: 2\nb:")
            f.flush()
            os.fsync(f.fileno())
            await asyncio.sleep(0.1)
            f.write(b" 3\n")
        await asyncio.sleep(0.8)
        assert seen == [b"a: 2\nb: 3\n"]
    finally:
        task.cancel()


async def test_rename_over_and_unchanged_touch(tmp_path: Path) -> None:
    path = tmp_path / "desired.yaml"
    path.write_bytes(b"a: 1\n")
    seen: list[bytes] = []
    watcher, task = await _watch(path, seen)
    try:
        tmp = tmp_path / ".desired.yaml.swp"
        tmp.write_bytes(b"a: 9\n")
        os.replace(tmp, path)
        await asyncio.sleep(0.6)
        assert seen == [b"a: 9\n"]
        os.utime(path)  # same bytes, new mtime: nothing to hand over
        await asyncio.sleep(0.6)
        assert seen == [b"a: 9\n"]
        watcher.trigger()  # SIGHUP forces a re-read
        await asyncio.sleep(0.6)
        assert seen == [b"a: 9\n", b"a: 9\n"]
    finally:
        task.cancel()


async def test_missing_file_is_waited_out(tmp_path: Path) -> None:
    path = tmp_path / "desired.yaml"
    path.write_bytes(b"a: 1\n")
    seen: list[bytes] = []
    _, task = await _watch(path, seen)
    try:
        path.unlink()
        await asyncio.sleep(0.3)
        path.write_bytes(b"a: 2\n")
        await asyncio.sleep(0.7)
        assert seen == [b"a: 2\n"]
    finally:
        task.cancel()
