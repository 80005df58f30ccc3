"""A real Prometheus on loopback for tests: scrapes Envoy admin /stats/prometheus every 0.5 s.

Debian's `prometheus` binary (deploy/ensure-test-services.sh installs it). Own session, stopped
by PID, storage in a temporary folder. Ready in ~0.2 s, first sample queryable ~5 s
(docs/architecture.md, "Test peers").
"""

from __future__ import annotations

import datetime
import json
import re
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import yaml

from harness.envoy_process import free_port, stop_group
from harness.local_server import log_tail, start_server


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


class PrometheusServer:
    def __init__(self, admin_ports: list[int], scrape_interval: str = "500ms") -> None:
        binary = prometheus_binary()
        if binary is None:
            raise FileNotFoundError("prometheus binary not installed")
        self.binary = binary
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = Path(tempfile.mkdtemp(prefix="ballast-prom-"))
        self._config = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": "1s"},
            "scrape_configs": [{
                "job_name": "envoy",
                "metrics_path": "/stats/prometheus",
                "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in admin_ports]}],
            }],
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15.0) -> PrometheusServer:
        config = self._dir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self._config))
        self.proc = start_server(
            "prometheus",
            [
                self.binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self._dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            self._dir / "prometheus.log",
            f"{self.url}/-/ready",
            timeout=timeout,
        )
        return self

    def scraped_since(self, wall_s: float) -> bool:
        """Every target's last scrape started after `wall_s` (epoch seconds): Prometheus then
        holds what each Envoy showed at that time."""
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=5) as response:
            targets = json.load(response)["data"]["activeTargets"]
        return bool(targets) and all(_epoch_s(t["lastScrape"]) > wall_s for t in targets)

    def log_tail(self, lines: int = 20) -> str:
        return log_tail(self._dir / "prometheus.log", lines)

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, 10)
        shutil.rmtree(self._dir, ignore_errors=True)


def _epoch_s(stamp: str) -> float:
    """An RFC 3339 time with nanoseconds (`2026-01-01T00:00:00.123456789Z`, or with an offset)
    in epoch seconds."""
    match = re.fullmatch(r"(.*?)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", stamp)
    if match is None:
        raise ValueError(f"not an RFC 3339 time: {stamp!r}")
    base, fraction, zone = match.groups()
    seconds = datetime.datetime.fromisoformat(base + ("+00:00" if zone == "Z" else zone))
    return seconds.timestamp() + float(f"0.{fraction or 0}")
