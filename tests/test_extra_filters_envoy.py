"""Operator-added HTTP filters: the two worked examples of docs/desired-state.md, taken from
the page itself, through the real Envoy 1.40 — the compression example gzips a response for
`Accept-Encoding: gzip`; the local rate limit example passes `ballast validate`; a filter Envoy
itself rejects fails it; `plan` diffs an added filter; a node whose Envoy does not list a
filter's type does not get it, and the notes say why."""

from __future__ import annotations

import gzip
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from envoy.config.core.v3.base_pb2 import Node
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    HttpConnectionManager,
)

from control_plane.admin.capability_keys import capabilities_for_key
from control_plane.cli.main import main
from control_plane.desired import parse_desired
from control_plane.translate import static_bootstrap, translate_pop
from control_plane.translate.capabilities import read_node_capabilities
from control_plane.translate.envoy_http_filters import ENVOY_1_40_HTTP_FILTER_TYPES
from control_plane.translate.resources import LISTENER_TYPE, ROUTE_TYPE, Capabilities
from harness.background_loop import BackgroundLoop
from harness.demo_origin import DemoOrigin
from harness.envoy_process import EnvoyProcess, free_port

DOCS = Path(__file__).resolve().parents[1] / "docs" / "desired-state.md"
COMPRESSOR = "envoy.extensions.filters.http.compressor.v3.Compressor"


def docs_example(name: str) -> str:
    """The YAML block right after `<!-- example: NAME -->` in docs/desired-state.md."""
    found = re.search(rf"<!-- example: {re.escape(name)} -->\n```yaml\n(.*?)```", DOCS.read_text(),
                      re.DOTALL)
    assert found, f"docs/desired-state.md has no example {name!r}"
    return found.group(1)


def desired_text(listeners: str, origin_port: int, listener_port: int) -> str:
    """A whole desired state around a docs example's `listeners:` block."""
    return f"""\
pops:
  ewr: {{listen_address: 127.0.0.1}}
origin_groups:
  shop:
    origins:
      primary: {{address: 127.0.0.1, port: {origin_port}}}
{listeners.replace("port: 10000", f"port: {listener_port}")}"""


@pytest.fixture(scope="module")
def origin() -> Iterator[int]:
    bg = BackgroundLoop()
    port = free_port()
    server = bg.run(DemoOrigin("primary", port).start())
    try:
        yield port
    finally:
        bg.run(server.stop())
        bg.close()


def get(port: int, headers: dict[str, str]) -> tuple[dict[str, str], bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/catalog", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as response:
        return {k.lower(): v for k, v in response.headers.items()}, response.read()


@pytest.mark.envoy
def test_docs_compression_example_gzips_through_envoy(origin: int) -> None:
    port = free_port()
    desired = parse_desired(desired_text(docs_example("compression"), origin, port), "<docs>")
    bootstrap = static_bootstrap(translate_pop(desired, "ewr", Capabilities()))
    admin = free_port()
    bootstrap["admin"]["address"]["socket_address"]["port_value"] = admin
    with EnvoyProcess(bootstrap, admin) as envoy:
        envoy.wait_ready()
        headers, body = get(port, {"accept-encoding": "gzip"})
        assert headers.get("content-encoding") == "gzip"
        assert json.loads(gzip.decompress(body))["origin"] == "primary"
        headers, body = get(port, {})
        assert "content-encoding" not in headers
        assert json.loads(body)["origin"] == "primary"


@pytest.mark.envoy
def test_docs_rate_limit_example_validates(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                           ) -> None:
    path = tmp_path / "desired.yaml"
    path.write_text(desired_text(docs_example("local rate limit"), 8080, 10000))
    assert main(["validate", str(path)]) == 0
    assert "pop ewr: OK (envoy 1.40" in capsys.readouterr().out


@pytest.mark.envoy
def test_a_filter_envoy_rejects_fails_validate(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    # a well-typed message Envoy refuses: a compressor without its library
    listeners = docs_example("compression")
    listeners = listeners[:listeners.index("          compressor_library:")] + \
        listeners[listeners.index("    virtual_hosts:"):]
    path = tmp_path / "desired.yaml"
    path.write_text(desired_text(listeners, 8080, 10000))
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert "pop ewr: rejected by envoy 1.40" in out and "CompressorLibrary" in out


def test_an_unknown_filter_type_is_a_validate_error_with_its_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "desired.yaml"
    path.write_text(desired_text(docs_example("compression").replace(
        "http.compressor.v3.Compressor", "http.compressor.v3.Compresser"), 8080, 10000))
    assert main(["validate", str(path), "--no-envoy"]) == 1
    err = capsys.readouterr().err
    assert re.search(r"desired\.yaml:\d+:\d+: listeners\[0\]\.http_filters\[0\]\.typed_config: "
                     r"unknown filter type 'type\.googleapis\.com/envoy\.extensions\.filters\."
                     r"http\.compressor\.v3\.Compresser'", err), err


def test_plan_diffs_an_added_filter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    with_filter = desired_text(docs_example("compression"), 8080, 10000)
    old.write_text(re.sub(r"    http_filters:.*?(?=    virtual_hosts:)", "", with_filter,
                          flags=re.DOTALL))
    new.write_text(with_filter)
    assert main(["plan", str(new), "--against", str(old)]) == 2
    out = capsys.readouterr().out
    assert "envoy.filters.http.compressor" in out and COMPRESSOR in out


def node_without(*missing: str) -> Node:
    node = Node(id="old-envoy")
    for type_name in sorted(ENVOY_1_40_HTTP_FILTER_TYPES - set(missing)):
        node.extensions.add(name=type_name, category="envoy.filters.http", type_urls=[type_name])
    return node


def test_a_node_whose_envoy_lacks_the_filter_does_not_get_it_and_the_notes_say_why() -> None:
    desired = parse_desired(desired_text(docs_example("compression"), 8080, 10000), "<docs>")
    lacking = read_node_capabilities(node_without(COMPRESSOR))
    assert "lack 1 HTTP filter type" in lacking.reason
    for caps, present in ((read_node_capabilities(node_without()).capabilities, True),
                          (lacking.capabilities, False)):
        resources = translate_pop(desired, "ewr", caps)
        listener = Listener.FromString(resources.of_type(LISTENER_TYPE)["edge"].payload)
        hcm = HttpConnectionManager.FromString(
            listener.filter_chains[0].filters[0].typed_config.value)
        names = [f.name for f in hcm.http_filters]
        assert names == (["envoy.filters.http.compressor"] if present else []) + [
            "envoy.filters.http.router"]
        notes = [n for n in resources.notes if "compressor" in n]
        assert bool(notes) is not present
        if not present:
            assert notes == [f"listener edge: filter envoy.filters.http.compressor not sent: the "
                             f"node's Envoy does not list {COMPRESSOR} in node.extensions"]


PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.compressor.v3.CompressorPerRoute"
PER_HOST = f"""
      - name: media
        domains: [media.test]
        origin_group: shop
        typed_per_filter_config:
          envoy.filters.http.compressor:
            "@type": {PER_ROUTE}
            disabled: true
"""


@pytest.mark.envoy
def test_a_per_host_config_turns_compression_off_for_that_host(origin: int) -> None:
    port = free_port()
    listeners = docs_example("compression").replace(
        '      - {name: shop, domains: ["*"], origin_group: shop}\n',
        PER_HOST.lstrip("\n") + '      - {name: shop, domains: ["*"], origin_group: shop}\n')
    desired = parse_desired(desired_text(listeners, origin, port), "<docs>")
    bootstrap = static_bootstrap(translate_pop(desired, "ewr", Capabilities()))
    admin = free_port()
    bootstrap["admin"]["address"]["socket_address"]["port_value"] = admin
    with EnvoyProcess(bootstrap, admin) as envoy:
        envoy.wait_ready()
        headers, _ = get(port, {"accept-encoding": "gzip"})
        assert headers.get("content-encoding") == "gzip"
        headers, body = get(port, {"accept-encoding": "gzip", "host": "media.test"})
        assert "content-encoding" not in headers
        assert json.loads(body)["origin"] == "primary"
    # a node lacking the compressor gets neither the filter nor its per-host config
    lacking = read_node_capabilities(node_without(COMPRESSOR)).capabilities
    routes = translate_pop(desired, "ewr", lacking).of_type(ROUTE_TYPE)["edge"].message
    assert all(not host.typed_per_filter_config for host in routes.virtual_hosts)


def test_a_per_host_config_must_name_a_filter_of_the_listener(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    listeners = docs_example("compression").replace(
        '      - {name: shop, domains: ["*"], origin_group: shop}\n',
        PER_HOST.replace("envoy.filters.http.compressor:", "envoy.filters.http.compresor:")
        .lstrip("\n"))
    path = tmp_path / "desired.yaml"
    path.write_text(desired_text(listeners, 8080, 10000))
    assert main(["validate", str(path), "--no-envoy"]) == 1
    assert ("listeners[0].virtual_hosts[0].typed_per_filter_config: no filter named "
            "'envoy.filters.http.compresor' in this listener's http_filters; did you mean "
            "'envoy.filters.http.compressor'?") in capsys.readouterr().err


def test_nodes_lacking_only_filters_nobody_added_share_a_translation() -> None:
    """The server narrows a node's missing filter types to those the desired state adds, so a
    node lacking other filter types keeps its plain key (`none` here)."""
    from control_plane.xds_port.server import intent_and_cache

    plain = parse_desired(desired_text(re.sub(
        r"    http_filters:.*?(?=    virtual_hosts:)", "", docs_example("compression"),
        flags=re.DOTALL), 8080, 10000), "<plain>")
    lacking = read_node_capabilities(node_without(COMPRESSOR)).capabilities
    _, cache = intent_and_cache(plain)
    assert cache.effective_capabilities("ewr", lacking).capabilities.key == "none"
    _, cache = intent_and_cache(parse_desired(desired_text(docs_example("compression"), 8080,
                                                           10000), "<docs>"))
    narrowed = cache.effective_capabilities("ewr", lacking).capabilities
    assert narrowed.missing_filters == {COMPRESSOR}
    assert narrowed.key.startswith("none-f")  # (no queue policy listed either)
    assert capabilities_for_key(narrowed.key) == Capabilities(queue_policies=False)
