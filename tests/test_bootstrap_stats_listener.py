"""`ballast bootstrap --stats-listener`: a central Prometheus reads `/stats/prometheus` through a
listener of its own while Envoy's admin stays on loopback (issue 25), through real Envoy.

Also: the bootstrap caps downstream connections (overload manager), so Envoy no longer warns
that they are unlimited.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from control_plane.cli.main import main
from harness.envoy_process import EnvoyProcess, free_port
from tests.support.example_service import example_service
from tests.support.replicas import until

pytestmark = pytest.mark.envoy
UNLIMITED = "no configured limit to the number of allowed active downstream connections"


def _get(url: str, method: str = "GET", headers: dict[str, str] | None = None
         ) -> tuple[int, str]:
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


async def test_stats_listener_serves_only_the_prometheus_stats(capsys, tmp_path: Path) -> None:
    admin, stats = free_port(), free_port()
    async with example_service(tmp_path) as (service, _):
        assert main(["bootstrap", "--pop", "ewr", "--node-id", "ewr-1", "--admin-port",
                     str(admin), "--xds", f"127.0.0.1:{service.server.port}", "--metrics-sink",
                     "--stats-listener", f"127.0.0.1:{stats}"]) == 0
        bootstrap = yaml.safe_load(capsys.readouterr().out)
        assert bootstrap["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
        envoy = EnvoyProcess(bootstrap, admin, log_level="info").start()
        try:
            await _only_the_stats(envoy, stats)
        finally:
            envoy.stop()


async def _only_the_stats(envoy: EnvoyProcess, stats: int) -> None:
    base = f"http://127.0.0.1:{stats}"

    def answers() -> bool:
        try:
            return _get(f"{base}/stats/prometheus")[0] == 200
        except OSError:
            return False

    await until(answers, 20, "the stats listener")
    code, body = _get(f"{base}/stats/prometheus")
    assert code == 200 and "# TYPE envoy_server_live gauge" in body
    assert 'ballast_pop="ewr"' in body  # every stat carries its PoP for Prometheus
    refused = {path: _get(f"{base}{path}", method)
               for path, method in [
                   ("/quitquitquit", "POST"), ("/config_dump", "GET"),
                   ("/runtime_modify?x=1", "POST"), ("/logging?level=trace", "POST"),
                   ("/stats/prometheus?filter=.*", "GET"), ("/stats", "GET"),
                   ("/stats/prometheus/../config_dump", "GET"),
                   ("/stats/prometheus%2F..%2Fconfig_dump", "GET"),
                   ("/stats/prometheus", "POST"), ("/", "GET")]}
    assert {path: code for path, (code, _) in refused.items()} == {
        path: 404 for path in refused}, refused
    assert not any("configuration" in body or "OK" in body for _, body in refused.values())
    assert envoy.proc is not None and envoy.proc.poll() is None  # /quitquitquit missed it
    # the admin itself is still only on loopback, and answers there
    assert json.loads(envoy.admin("/server_info"))["state"] in ("LIVE", "INITIALIZING",
                                                                 "PRE_INITIALIZING")
    # connections are capped: no warning that they are unlimited
    assert UNLIMITED not in envoy.log_path.read_text(errors="replace").lower()
