"""Start-up failures leave nothing running and nothing locked, and say why."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.cli.main import main
from control_plane.decisions.read import iter_records
from control_plane.intent.sqlite_store import StateCorrupted, StateStore
from control_plane.intent.state_dir_lock import StateDirBusy, StateDirLock
from control_plane.intent.store import RAMP_KIND, IntentBatch
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.security.cert_dir import CertDir
from control_plane.security.tls import TlsConfigError, TlsFiles

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "desired.yaml"


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize("which", ["xds", "admin"])
async def test_a_taken_port_fails_cleanly(tmp_path: Path, taken_port: int, which: str) -> None:
    taken, free = f"127.0.0.1:{taken_port}", "127.0.0.1:0"
    config = ServiceConfig(
        desired_path=EXAMPLE,
        state_dir=tmp_path,
        xds_address=taken if which == "xds" else free,
        admin_address=taken if which == "admin" else free,
        probes=False,
    )
    with pytest.raises(OSError, match=str(taken_port)):
        await BallastService(config).start()
    # the state and the log were closed: a second server can open them and start
    retry = BallastService(
        ServiceConfig(desired_path=EXAMPLE, state_dir=tmp_path, xds_address=free,
                      admin_address=free, probes=False)
    )
    await retry.start()
    assert retry.ready
    await retry.stop(0)


async def test_corrupted_state_refuses_to_start(tmp_path: Path) -> None:
    (tmp_path / "state.db").write_bytes(b"this is not a database" * 100)
    config = ServiceConfig(desired_path=EXAMPLE, state_dir=tmp_path, xds_address="127.0.0.1:0",
                           admin_address=None, probes=False)
    with pytest.raises(StateCorrupted, match=r"state\.db"):
        await BallastService(config).start()


async def test_a_failure_after_the_store_opened_unwinds_like_a_stop(tmp_path: Path) -> None:
    """A ramp record that does not parse is found while restoring, with the lock, the decision
    log and the store already held: the start fails and unwinds what it had started, as `stop`
    does — a second server starts on the same folder at once."""
    with StateStore(tmp_path) as store:
        await store.write(IntentBatch(records=((RAMP_KIND, "ewr/shop", {"bogus": 1}),)))

    def config() -> ServiceConfig:
        return ServiceConfig(desired_path=EXAMPLE, state_dir=tmp_path,
                             xds_address="127.0.0.1:0", admin_address=None, probes=False)

    with pytest.raises(StateCorrupted, match="ramp 'ewr/shop'"):
        await BallastService(config()).start()
    assert "shutdown" not in [r["kind"] for r in iter_records(tmp_path)]  # it never served
    with StateStore(tmp_path) as store:  # the operator removes the bad record
        await store.write(IntentBatch(records=((RAMP_KIND, "ewr/shop", None),)))
    second = BallastService(config())
    await second.start()
    await second.stop(0)
    assert [r["kind"] for r in iter_records(tmp_path)][-1] == "shutdown"


async def test_one_server_per_state_directory(tmp_path: Path) -> None:
    def config() -> ServiceConfig:
        return ServiceConfig(desired_path=EXAMPLE, state_dir=tmp_path,
                             xds_address="127.0.0.1:0", admin_address=None, probes=False)

    first = BallastService(config())
    await first.start()
    try:
        with pytest.raises(StateDirBusy, match=f"pid {os.getpid()}"):
            await BallastService(config()).start()
    finally:
        await first.stop(0)
    second = BallastService(config())  # the lock went with the first server
    await second.start()
    await second.stop(0)


def test_serve_refuses_a_busy_state_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = StateDirLock(tmp_path).acquire()
    try:
        code = main(["serve", str(EXAMPLE), "--state-dir", str(tmp_path),
                     "--xds-address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0"])
    finally:
        lock.release()
    assert code == 1
    err = capsys.readouterr().err
    assert "already in use" in err and "Traceback" not in err


async def test_tls_files_that_do_not_fit_refuse_the_start_and_hold_nothing(
    tmp_path: Path,
) -> None:
    one, two = CertDir(tmp_path / "one"), CertDir(tmp_path / "two")
    for certs in (one, two):
        ca, _ = certs.load_or_make_ca(1)
        certs.make_server(ca, ["127.0.0.1"], 1)

    def config(key: Path) -> ServiceConfig:
        return ServiceConfig(desired_path=EXAMPLE, state_dir=tmp_path / "state",
                             xds_address="127.0.0.1:0", admin_address=None, probes=False,
                             tls=TlsFiles(one.server.cert, key, one.ca.cert))

    with pytest.raises(TlsConfigError, match="is not the key of"):
        await BallastService(config(two.server.key)).start()
    service = BallastService(config(one.server.key))
    await service.start()
    tls = service.status()["xds_tls"]
    assert tls["reloads"] == 0 and tls["last_error"] is None and tls["not_after"]
    await service.stop(0)
