"""A running service against bad files, failing code and a full disk (issue 8): the desired-state
watcher survives anything and says so (a config_rejected record, /readyz), a full disk during a
reload is a rejected apply recorded once space returns, and an empty state.db next to a decision
log is refused unless accepted on purpose."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from control_plane.cli.main import main
from control_plane.decisions import log as log_module
from control_plane.decisions.log import DecisionLog
from control_plane.decisions.read import iter_records
from control_plane.intent.sqlite_store import StateStore, StateSuspicious
from control_plane.lifecycle.service import BallastService, ServiceConfig
from harness.eventually import eventually

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "desired.yaml"
EDITED = EXAMPLE.read_text().replace("port_offset: 1}", "port_offset: 2}")


def config(desired: Path, state_dir: Path, **overrides: Any) -> ServiceConfig:
    settings: dict[str, Any] = {"admin_address": "127.0.0.1:0", **overrides}
    return ServiceConfig(desired_path=desired, state_dir=state_dir, xds_address="127.0.0.1:0",
                         probes=False, reload_poll_s=0.05, **settings)


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[BallastService]:
    desired = tmp_path / "desired.yaml"
    shutil.copy(EXAMPLE, desired)
    running = BallastService(config(desired, tmp_path / "state"))
    await running.start()
    try:
        yield running
    finally:
        await running.stop(0)


async def readyz(service: BallastService) -> tuple[int, dict[str, Any]]:
    assert service.admin is not None
    async with aiohttp.ClientSession(service.admin.url) as http, http.get("/readyz") as answer:
        return answer.status, await answer.json()


def records(service: BallastService, kind: str) -> list[dict[str, Any]]:
    service.decisions.sync()
    return [r for r in iter_records(service.config.state_dir) if r["kind"] == kind]


async def test_watcher_survives_bad_files_and_failing_code(service: BallastService) -> None:
    path = service.config.desired_path
    digest = service.server.intent.desired.digest
    # a document nested hundreds of levels deep killed the watcher with a RecursionError
    path.write_text("pops: " + "[" * 400 + "]" * 400)
    rejected = await eventually(lambda: records(service, "config_rejected"))
    assert any("nested more than 32 levels deep" in p for p in rejected[-1]["detail"]["problems"])
    # a symlink to a device: refused, not read
    path.unlink()
    path.symlink_to("/dev/zero")
    rejected = await eventually(lambda: records(service, "config_rejected")[1:])
    assert "not a regular file (a character device)" in rejected[-1]["detail"]["problems"][0]
    assert (await readyz(service))[0] == 200  # rejected files are no internal errors
    path.unlink()
    # failing code while applying: rejected with an internal error, /readyz says so
    real_apply = service.reload._apply

    async def failing(data: bytes, *_: object) -> bool:
        raise RecursionError("maximum recursion depth exceeded")

    service.reload._apply = failing  # type: ignore[method-assign]
    path.write_text(EDITED)
    rejected = await eventually(lambda: records(service, "config_rejected")[2:])
    assert "internal error while reloading: RecursionError" in rejected[-1]["detail"]["problems"][0]
    status, body = await readyz(service)
    assert status == 503 and "internal error (RecursionError" in body["reason"]
    assert service.server.intent.desired.digest == digest  # running state kept
    # the watcher is alive: SIGHUP's re-read applies once the code works again
    service.reload._apply = real_apply  # type: ignore[method-assign]
    service.watcher.trigger()
    await eventually(lambda: service.server.intent.desired.digest != digest)
    assert (await readyz(service))[0] == 200
    # even an exception escaping the hand-over itself does not end the watcher
    real_change = service.watcher.on_change

    async def escaping(data: bytes) -> None:
        raise KeyError("lost")

    service.watcher.on_change = escaping
    path.write_text(EXAMPLE.read_text())
    await eventually(lambda: len(records(service, "config_rejected")) == 4)
    assert "KeyError" in records(service, "config_rejected")[-1]["detail"]["problems"][0]
    service.watcher.on_change = real_change
    service.watcher.trigger()
    await eventually(lambda: service.server.intent.desired.digest == digest)
    assert (await readyz(service))[0] == 200


async def test_records_the_log_cannot_take_are_written_once_it_can(
    service: BallastService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An injected writer raising ENOSPC: the reload's record (and the records of any tick
    meanwhile) waits, in order, and /readyz says why; once writes work again it is written,
    marked as recorded late."""
    real_write = service.decisions.write_drafts

    def full(drafts: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(service.decisions, "write_drafts", full)
    assert await service.reload.apply(EDITED.encode())
    status, body = await readyz(service)
    assert status == 503 and "decision log cannot be written" in body["reason"]
    assert service.recorder.waiting >= 1  # the reload's (and any tick's meanwhile)
    assert f"{service.recorder.waiting} records waiting" in body["reason"]
    assert not [r for r in records(service, "config_applied") if "recorded_late" in r["detail"]]
    monkeypatch.setattr(service.decisions, "write_drafts", real_write)
    late = await eventually(lambda: [r for r in records(service, "config_applied")
                                if "recorded_late" in (r["detail"] or {})])
    assert "No space left" in late[0]["detail"]["recorded_late"]["reason"]
    assert (await readyz(service))[0] == 200


def test_a_failed_write_leaves_no_torn_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with DecisionLog(tmp_path) as log:
        log.record("startup", rule="one")
        size = log.path.stat().st_size
        real_write = os.write

        def half(fd: int, data: bytes) -> int:
            return real_write(fd, data[: len(data) // 2])

        monkeypatch.setattr(log_module.os, "write", half)
        with pytest.raises(OSError, match="short write"):
            log.record("startup", rule="two")
        monkeypatch.setattr(log_module.os, "write", real_write)
        assert log.path.stat().st_size == size
        log.record("startup", rule="three")
    assert [r["rule"] for r in iter_records(tmp_path)] == ["one", "three"]
    assert [r["seq"] for r in iter_records(tmp_path)] == [1, 2]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MB tmpfs (needs root); skipped where mounting is not allowed."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)],
                          capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def test_a_full_disk_during_a_reload_is_a_rejected_apply_recorded_later(
    tmp_path: Path, small_disk: Path
) -> None:
    desired = tmp_path / "desired.yaml"
    desired.write_text(EXAMPLE.read_text())
    running = BallastService(config(desired, small_disk / "state"))
    await running.start()
    try:
        digest = running.server.intent.desired.digest
        filler = small_disk / "filler"
        with open(filler, "wb") as handle:  # fill the disk to the last byte
            try:
                while True:
                    handle.write(b"\0" * 65536)
                    handle.flush()
            except OSError as err:
                assert err.errno == errno.ENOSPC
        desired.write_text(EDITED)
        await eventually(lambda: running.reload.error is None and (
            running.recorder.error is not None or records(running, "config_rejected")), 10)
        assert running.server.intent.desired.digest == digest  # not applied
        assert running.store.load().desired_digest == digest
        filler.unlink()  # space returns
        rejected = await eventually(lambda: records(running, "config_rejected"))
        assert "bytes free where the state is saved" in rejected[-1]["detail"]["problems"][0]
        await eventually(lambda: running.recorder.error is None)
        assert (await readyz(running))[0] == 200
        running.watcher.trigger()  # the same file, now with room: applied
        await eventually(lambda: running.server.intent.desired.digest != digest)
    finally:
        await running.stop(0)


def _used_state_dir(state_dir: Path) -> None:
    with DecisionLog(state_dir) as log:
        log.record("startup", rule="serving")
        log.record("weight_shift", pop="ewr", group="shop", rule="step")


@pytest.mark.parametrize("content", ["empty", "other tables", "deleted"])
async def test_an_empty_or_deleted_state_db_next_to_a_decision_log_is_refused(
    tmp_path: Path, content: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _used_state_dir(tmp_path)
    state = tmp_path / "state.db"
    if content == "empty":
        state.write_bytes(b"")
    elif content == "deleted":  # a decision log showing moved weights, and no state.db
        pass
    else:
        import sqlite3

        with sqlite3.connect(state) as db:
            db.execute("CREATE TABLE unrelated (x)")
    with pytest.raises(StateSuspicious, match="--accept-empty-state"):
        await BallastService(config(EXAMPLE, tmp_path, admin_address=None)).start()
    code = await asyncio.to_thread(main, [
        "serve", str(EXAMPLE), "--state-dir", str(tmp_path), "--xds-address", "127.0.0.1:0",
        "--admin-address", "127.0.0.1:0", "--no-probes"])
    err = capsys.readouterr().err
    found = "is missing" if content == "deleted" else "is there but empty"
    assert code == 1 and found in err and "Traceback" not in err
    assert state.exists() == (content != "deleted")  # the refusal created nothing
    accepted = BallastService(config(EXAMPLE, tmp_path, admin_address=None,
                                     accept_empty_state=True))
    await accepted.start()
    await accepted.stop(0)
    startup = [r for r in iter_records(tmp_path) if r["kind"] == "startup"][-1]
    assert startup["detail"]["empty_state_accepted"] == str(state)
    assert "start from the desired state's defaults" in startup["detail"]["started_from_defaults"]


async def test_a_fresh_start_says_it_starts_from_defaults(tmp_path: Path) -> None:
    fresh = BallastService(config(EXAMPLE, tmp_path, admin_address=None))
    await fresh.start()
    await fresh.stop(0)
    again = BallastService(config(EXAMPLE, tmp_path, admin_address=None))
    await again.start()  # state.db saved by the first run: restored, not defaults
    await again.stop(0)
    first, second = [r for r in iter_records(tmp_path) if r["kind"] == "startup"]
    assert "started_from_defaults" in first["detail"]
    assert "started_from_defaults" not in second["detail"]


def test_a_fresh_state_dir_is_no_surprise(tmp_path: Path) -> None:
    with StateStore(tmp_path) as store:  # no file, no log: a fresh start from defaults
        assert store.blank
    with StateStore(tmp_path, history="a log") as store:  # the file it made holds tables
        assert not store.blank
