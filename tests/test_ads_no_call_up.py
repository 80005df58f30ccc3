"""ads/ is a library the app embeds: it never imports the rooms above it (docs/rooms.toml) and
never calls them either. What it serves is handed to it — the output the change transaction
prepared, and what the cache builds lazily from (`translate/served.py`'s `Served`, plain values:
the only code it runs for that is translation) — and what happens on its streams it tells
through its `Callbacks`, the one way out it has.

Shown on a real exchange through the service's own wiring (`BallastServer`), in plaintext and
with mTLS (where each stream's identity and peer check are the injected functions): a node on
SotW and one on delta, one of them with capabilities no node had (its resources built lazily),
a weight change pushed through the change transaction; every call made from a frame of
control_plane/ads/ into a module of a room ads/ must not import is listed, and the list must
hold the `Callbacks` methods only.
"""

from __future__ import annotations

import sys
import threading
import tomllib
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
import pytest

from control_plane.ads.callbacks import Callbacks
from control_plane.security.cert_dir import CertDir
from control_plane.security.tls import ReloadingCredentials, TlsFiles
from control_plane.translate.resources import CLUSTER_TYPE as CDS
from control_plane.translate.resources import ENDPOINT_TYPE as EDS
from control_plane.translate.resources import LISTENER_TYPE as LDS
from control_plane.translate.resources import ROUTE_TYPE as RDS
from control_plane.xds_port.server import BallastServer
from harness.ads_desired import desired
from harness.intent_changes import set_weights
from harness.xds_client import XdsClient, local_channel, make_node

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "control_plane"
RULES = tomllib.loads((ROOT / "docs" / "rooms.toml").read_text())
ABOVE = set(RULES["rooms"]["ads"]["must_not_import"])
TOLD = {name for name in vars(Callbacks) if name.startswith("on_")}


def _room(filename: str) -> str | None:
    path = Path(filename)
    if not path.is_relative_to(PACKAGE):
        return None
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else None


def calls_up(found: list[str], seen: set[str] | None = None
             ) -> Callable[[FrameType, str, Any], None]:
    """A profiler noting each call from an ads/ frame into a room above it but a callback
    (`found`), and the rooms ads/ calls at all (`seen`)."""

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        caller = frame.f_back
        if event != "call" or caller is None or _room(caller.f_code.co_filename) != "ads":
            return
        room = _room(frame.f_code.co_filename)
        if seen is not None and room is not None:
            seen.add(f"{room}/{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}")
        if room in ABOVE and frame.f_code.co_name not in TOLD:
            found.append(f"{Path(caller.f_code.co_filename).name}:{caller.f_code.co_name} -> "
                         f"{room}/{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}")

    return profile


Channel = Callable[[str, str], grpc.aio.Channel]  # (PoP, node id) -> a channel for that node


def _mtls(certs: CertDir, port: int) -> Channel:
    authority, _ = certs.load_or_make_ca(1)

    def channel(pop: str, node_id: str) -> grpc.aio.Channel:
        pair = certs.make_node(authority, pop, node_id, 1)
        credentials = grpc.ssl_channel_credentials(
            certs.ca.cert.read_bytes(), pair.key.read_bytes(), pair.cert.read_bytes())
        return grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials,
                                       options=[("grpc.use_local_subchannel_pool", 1)])

    return channel


async def _exchange(server: BallastServer, channel: Channel) -> None:
    bare = make_node("bare", "sjc")
    del bare.extensions[:]  # no queue policy listed: a capability key no node had
    channels = [channel("ewr", "sotw"), channel("sjc", "bare")]
    clients = [await XdsClient(channels[0], make_node("sotw", "ewr")).start(),
               await XdsClient(channels[1], bare, delta=True).start()]
    try:
        for client in clients:
            await client.subscribe(CDS)
            await client.wait_for(lambda c: bool(c.names(CDS)))
            await client.subscribe(EDS, sorted(client.names(CDS)))
            await client.subscribe(LDS)
            await client.wait_for(lambda c: bool(c.names(LDS)))
            await client.subscribe(RDS, ["edge"])
            await client.wait_for(lambda c: bool(c.names(RDS)))
        await set_weights(server.intent, "ewr", "shop", {"primary": 60, "secondary": 40})
        await set_weights(server.intent, "sjc", "shop", {"primary": 70, "secondary": 30})
        await clients[0].wait_for(lambda c: len(c.responses(EDS)) >= 2)
        await clients[1].wait_for(lambda c: len(c.responses(EDS)) >= 2)
    finally:
        for client in clients:
            await client.close()
        for channel in channels:
            await channel.close()


@pytest.mark.parametrize("mtls", [False, True], ids=["plaintext", "mtls"])
async def test_ads_calls_nothing_above_it_but_its_callbacks(tmp_path: Path, mtls: bool) -> None:
    records: list[str] = []
    certs = CertDir(tmp_path / "certs")
    if mtls:
        authority, _ = certs.load_or_make_ca(1)
        certs.make_server(authority, ["127.0.0.1"], 1)
    server = BallastServer(desired(listener_port=10000, primary_port=8081, secondary_port=8082),
                           xds_address="127.0.0.1:0",
                           record=lambda kind, fields: records.append(kind),
                           tls=ReloadingCredentials(TlsFiles(certs.server.cert, certs.server.key,
                                                             certs.ca.cert)) if mtls else None)
    await server.start()
    channel: Channel = (_mtls(certs, server.port) if mtls else
                        lambda pop, node_id: local_channel(f"127.0.0.1:{server.port}"))
    found: list[str] = []
    seen: set[str] = set()
    profile = calls_up(found, seen)
    sys.setprofile(profile)
    threading.setprofile(profile)  # type: ignore[arg-type]
    try:
        await _exchange(server, channel)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        await server.stop(0.5)
    assert "node_connected" in records  # told, through the callbacks
    assert "translate/served.py:translate_served" in seen  # the new key, built down here
    assert found == [], "ads/ calls up: " + "; ".join(sorted(set(found)))


def test_the_watch_sees_a_call_up() -> None:
    """The control: a function of an ads/ module calling a lifecycle/ function is listed."""
    from control_plane.lifecycle import service

    scope: dict[str, Any] = {"up": service._log_history, "path": ROOT / "no such dir"}
    exec(compile("def calls():\n    return up(path)\n", str(PACKAGE / "ads" / "made_up.py"),
                 "exec"), scope)
    found: list[str] = []
    sys.setprofile(calls_up(found))
    try:
        scope["calls"]()
    finally:
        sys.setprofile(None)
    assert found == ["made_up.py:calls -> lifecycle/service.py:_log_history"], found
