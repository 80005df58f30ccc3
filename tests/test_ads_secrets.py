"""SDS over the ADS stream: who receives which secret, and private keys never on a plaintext
stream off loopback. Real gRPC, simulated nodes (SotW and delta).

- a node of PoP sjc never receives a secret only ewr's listeners use, even when it asks for it
  by name; a node of ewr does;
- without mTLS, a stream receives no secret unless the operator allowed loopback peers and the
  peer is on loopback; a refused SDS request is never answered and is recorded once
  (`secrets_refused`).
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from control_plane.ads.admission import peer_on_loopback
from control_plane.desired import parse_desired
from control_plane.translate.resources import CLUSTER_TYPE, LISTENER_TYPE, SECRET_TYPE
from control_plane.xds_port.server import BallastServer
from harness.envoy_process import free_port
from harness.xds_client import XdsClient, local_channel, make_node
from tests.support.tls_listeners import HOSTNAMES, TlsSite, tls_desired_yaml

SECRETS = ["https.shop", "https.media"]


def site_desired(tmp_path: Path) -> Any:
    site = TlsSite(tmp_path / "certs")
    for name, hostname in HOSTNAMES.items():
        site.write(name, hostname)
    return parse_desired(tls_desired_yaml(
        site, https_port=free_port(), listener_port=free_port(), primary_port=free_port(),
        secondary_port=free_port()), "<tls>")


@asynccontextmanager
async def serving(tmp_path: Path, address: str = "127.0.0.1", **options: Any
                  ) -> AsyncIterator[tuple[BallastServer, list[tuple[str, dict[str, Any]]]]]:
    records: list[tuple[str, dict[str, Any]]] = []
    server = BallastServer(site_desired(tmp_path), xds_address=f"{address}:0",
                           record=lambda kind, fields: records.append((kind, fields)),
                           **options)
    await server.start()
    try:
        yield server, records
    finally:
        await server.stop(0.1)


async def ask_for_secrets(target: str, pop: str, delta: bool) -> XdsClient:
    """A node that asks for both secrets by name, then for clusters: once the clusters are
    there, its SDS request was handled (a stream's requests are handled in order)."""
    client = await XdsClient(local_channel(target), make_node(f"{pop}-1", pop),
                             delta=delta).start()
    await client.subscribe(LISTENER_TYPE)
    await client.subscribe(SECRET_TYPE, SECRETS)
    await client.subscribe(CLUSTER_TYPE)
    await client.wait_for(lambda c: bool(c.names(CLUSTER_TYPE)))
    return client


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_a_pop_receives_only_the_secrets_of_listeners_it_serves(
    tmp_path: Path, delta: bool
) -> None:
    async with serving(tmp_path, allow_plaintext_secrets=True) as (server, _):
        target = f"127.0.0.1:{server.port}"
        ewr = await ask_for_secrets(target, "ewr", delta)
        sjc = await ask_for_secrets(target, "sjc", delta)
        try:
            await ewr.wait_for(lambda c: c.names(SECRET_TYPE) == set(SECRETS))
            assert ewr.names(LISTENER_TYPE) == {"edge", "https"}
            assert sjc.names(LISTENER_TYPE) == {"edge"}
            assert sjc.names(SECRET_TYPE) == set()
            assert not [r for r in sjc.responses(SECRET_TYPE) if r.names]
        finally:
            await ewr.close()
            await sjc.close()


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_a_plaintext_stream_gets_no_private_key_without_the_loopback_allowance(
    tmp_path: Path, delta: bool
) -> None:
    async with serving(tmp_path) as (server, records):
        client = await ask_for_secrets(f"127.0.0.1:{server.port}", "ewr", delta)
        try:
            assert client.names(SECRET_TYPE) == set()
            assert not client.responses(SECRET_TYPE)
            refused = [f for kind, f in records if kind == "secrets_refused"]
            assert len(refused) == 1
            assert refused[0]["node"] == "ewr-1"
            assert sorted(refused[0]["secrets"]) == sorted(SECRETS)
            assert "not mTLS" in refused[0]["reason"]
            assert "--allow-plaintext-secrets" in refused[0]["reason"]
        finally:
            await client.close()


def outside_address() -> str | None:
    """This machine's address on a non-loopback interface (no packet is sent), if it has one."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if peer_on_loopback(f"ipv4:{address}:1") else address


async def test_a_plaintext_stream_off_loopback_gets_no_private_key_even_when_allowed(
    tmp_path: Path,
) -> None:
    address = outside_address()
    if address is None:
        pytest.skip("no non-loopback IPv4 address on this machine")
    async with serving(tmp_path, address, allow_plaintext_secrets=True) as (server, records):
        client = await ask_for_secrets(f"{address}:{server.port}", "ewr", False)
        try:
            assert client.names(LISTENER_TYPE) == {"edge", "https"}
            assert client.names(SECRET_TYPE) == set()
            assert not client.responses(SECRET_TYPE)
            (refused,) = [f for kind, f in records if kind == "secrets_refused"]
            assert f"ipv4:{address}:" in refused["reason"]
            assert "is not on loopback" in refused["reason"]
        finally:
            await client.close()


@pytest.mark.parametrize(
    ("peer", "loopback"),
    [("ipv4:127.0.0.1:5000", True), ("ipv4:127.3.4.5:1", True), ("ipv6:[::1]:5000", True),
     ("ipv4:192.0.2.2:5000", False), ("ipv6:[2001:db8::1]:5000", False), ("unix:/x", True),
     ("ipv4:not-an-ip:1", False), ("", False)],
)
def test_peer_on_loopback(peer: str, loopback: bool) -> None:
    assert peer_on_loopback(peer) is loopback
