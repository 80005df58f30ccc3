"""A real etcd on loopback for tests: Debian's `etcd` binary (deploy/ensure-test-services.sh
installs `etcd-server`). Own session, stopped by PID, data in a temporary folder. Healthy in
~1 s (docs/architecture.md, "Test peers"). `pause()`/`resume()` stop and continue the process
(SIGSTOP/SIGCONT) to make it unreachable without losing its data; `stop()` ends it;
`start()` may be called again on the same data directory. With `tls` (files from `ballast certs
--etcd-member 127.0.0.1 --etcd-client ...`) clients need TLS and a client certificate of etcd's
CA (`--client-cert-auth`); readiness is then asked on a plaintext metrics URL.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.envoy_process import free_port
from harness.local_server import log_tail, start_server


def etcd_binary() -> str | None:
    return shutil.which("etcd")


@dataclass(frozen=True)
class EtcdTls:
    ca: Path  # etcd's CA
    cert: Path  # the member's certificate (naming 127.0.0.1)
    key: Path


class EtcdServer:
    def __init__(self, tls: EtcdTls | None = None) -> None:
        binary = etcd_binary()
        if binary is None:
            raise FileNotFoundError("etcd binary not installed")
        self.binary = binary
        self.tls = tls
        self.client_port = free_port()
        self.peer_port = free_port()
        self.metrics_port = free_port()
        self.endpoint = f"127.0.0.1:{self.client_port}"
        self.url = f"etcd://{self.endpoint}"
        self._dir = Path(tempfile.mkdtemp(prefix="ballast-etcd-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> EtcdServer:
        client = f"{'https' if self.tls else 'http'}://{self.endpoint}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        metrics = f"http://127.0.0.1:{self.metrics_port}"
        tls = [] if self.tls is None else [
            "--cert-file", str(self.tls.cert), "--key-file", str(self.tls.key),
            "--trusted-ca-file", str(self.tls.ca), "--client-cert-auth"]
        self.proc = start_server(
            "etcd",
            [
                self.binary,
                "--name", "test",
                "--data-dir", str(self._dir / "data"),
                "--listen-client-urls", client,
                "--advertise-client-urls", client,
                "--listen-peer-urls", peer,
                "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"test={peer}",
                "--listen-metrics-urls", metrics,
                *tls,
            ],
            self._dir / "etcd.log",
            f"{metrics}/health",
            ready=lambda body: b'"true"' in body,
            timeout=timeout,
        )
        return self

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def log_tail(self, lines: int = 20) -> str:
        return log_tail(self._dir / "etcd.log", lines)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)
