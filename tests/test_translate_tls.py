"""Translating TLS listeners: one SNI filter chain per certificate plus the default chain, the
certificate named as an SDS secret on ADS, ALPN and versions; a renewal re-builds the one
Secret and nothing else (the listener, which names it, stays byte for byte), and the
incremental translation equals the full one."""

from __future__ import annotations

from pathlib import Path

from envoy.extensions.transport_sockets.tls.v3.tls_pb2 import DownstreamTlsContext

from control_plane.desired import parse_desired
from control_plane.translate import translate_pop
from control_plane.translate.pop import built_resources
from control_plane.translate.resources import LISTENER_TYPE, SECRET_TYPE, Capabilities
from tests.support.tls_listeners import HOSTNAMES, TlsSite, tls_desired_yaml


def test_renewal_rebuilds_only_the_secret(tmp_path: Path) -> None:
    site = TlsSite(tmp_path)
    for name, hostname in HOSTNAMES.items():
        site.write(name, hostname)
    text = tls_desired_yaml(site, https_port=8443, listener_port=8080, primary_port=1,
                            secondary_port=2)
    before = translate_pop(parse_desired(text, "d"), "ewr", Capabilities())
    listener = before.of_type(LISTENER_TYPE)["https"].message
    assert [list(c.filter_chain_match.server_names) for c in listener.filter_chains] == [
        ["shop.test"], ["media.test"]]
    assert [f.name for f in listener.listener_filters] == ["envoy.filters.listener.tls_inspector"]
    context = DownstreamTlsContext()
    listener.default_filter_chain.transport_socket.typed_config.Unpack(context)
    common = context.common_tls_context
    (sds,) = common.tls_certificate_sds_secret_configs
    assert sds.name == "https.shop" and sds.sds_config.HasField("ads")
    assert list(common.alpn_protocols) == ["h2", "http/1.1"]
    assert not context.HasField("require_client_certificate")

    site.write("shop", HOSTNAMES["shop"])
    renewed = parse_desired(text, "d")
    after = translate_pop(renewed, "ewr", Capabilities(), previous=before)
    assert built_resources(after) == ((SECRET_TYPE, "https.shop"),)
    assert after.of_type(LISTENER_TYPE)["https"] is before.of_type(LISTENER_TYPE)["https"]
    full = translate_pop(renewed, "ewr", Capabilities())
    for type_url, items in full.by_type.items():
        assert {n: r.payload for n, r in items.items()} == {
            n: r.payload for n, r in after.of_type(type_url).items()}, type_url
