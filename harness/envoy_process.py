"""Run a real Envoy: start it from a bootstrap, wait for /ready, stop it; free loopback ports.

Used by `make run` (the demo fleet), the tests and the benchmarks; the binary is found as
`ballast validate` finds it (`control_plane/cli/envoy_validate.py`). Envoy starts with
--disable-hot-restart --concurrency 1, admin on loopback, in its own session so it can be stopped
by PID (docs/architecture.md, "Running Envoy").
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from control_plane.cli.envoy_validate import find_envoy
from harness.eventually import eventually_blocking

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the process that started it dies (Linux), so
    a crashed test run or demo never leaves Envoys behind."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return


_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_range() -> tuple[int, int]:
    """The ports this process picks from: 10,000 up to the kernel's ephemeral range, split
    into equal disjoint slices when tests run in parallel workers (`PYTEST_XDIST_WORKER`
    gwN of `PYTEST_XDIST_WORKER_COUNT`), so two workers never pick the same port in the
    moment between the pick and their server's bind."""
    low, high = 10_000, max(10_001, _ephemeral_low() - 1)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or count < 2:
        return low, high
    width = (high - low) // count
    first = low + int(worker[2:]) % count * width
    return first, first + width - 1


def free_port() -> int:
    """A free loopback port for a server to bind later (Envoy listeners, admin, xDS).

    Taken below the kernel's ephemeral range: a port the kernel picked with bind(0) can be
    handed to some client's outgoing connection before our server binds it (seen as "Address
    already in use" on a busy test run). Never the same port twice in one process.
    """
    first, last = _port_range()
    for _ in range(200):
        port = random.randint(first, last)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EnvoyProcess:
    """One Envoy process started from a bootstrap dict, admin on 127.0.0.1:admin_port."""

    def __init__(
        self,
        bootstrap: dict[str, Any],
        admin_port: int,
        *,
        log_path: Path | None = None,
        binary: str | None = None,
        log_level: str = "warning",
    ) -> None:
        self.bootstrap = bootstrap
        self.admin_port = admin_port
        self.binary = find_envoy(binary)
        self._dir = Path(tempfile.mkdtemp(prefix="ballast-envoy-"))
        self.log_path = log_path or self._dir / "envoy.log"
        self.log_level = log_level
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> EnvoyProcess:
        self._dir.mkdir(exist_ok=True)  # again after a stop
        config = self._dir / "bootstrap.json"
        config.write_text(json.dumps(self.bootstrap))
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child process
        self.proc = subprocess.Popen(
            [
                self.binary,
                "-c",
                str(config),
                "--disable-hot-restart",
                "--concurrency",
                "1",
                "-l",
                self.log_level,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        log.close()
        return self

    def wait_ready(self, timeout: float = 15.0) -> None:
        """Until admin's /ready says LIVE; RuntimeError if Envoy exits first, TimeoutError
        after `timeout` s (both with the log's tail)."""

        def live() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"envoy exited with {self.proc.returncode}: {self.log_tail()}")
            return self.admin("/ready").strip() == "LIVE"

        try:
            eventually_blocking(live, timeout, "envoy ready",
                                ignore=(OSError, urllib.error.URLError))
        except AssertionError:
            raise TimeoutError(f"envoy not ready after {timeout}s: {self.log_tail()}") from None

    def admin(self, path: str, method: str = "GET") -> str:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.admin_port}{path}", method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.read().decode()
        except urllib.error.HTTPError as err:  # /ready answers 503 while not ready
            return err.read().decode()

    def admin_json(self, path: str) -> Any:
        return json.loads(self.admin(path))

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 5.0) -> None:
        """Stop Envoy and remove its private folder (the bootstrap, and the log unless
        `log_path` put it elsewhere)."""
        if self.proc is not None:
            stop_group(self.proc, timeout)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> EnvoyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_group(proc: subprocess.Popen[Any], timeout: float) -> None:
    """A process started in its own session stopped with its group: SIGTERM, then SIGKILL
    after `timeout` s. Nothing if it has exited already."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
