"""`BallastServer`: the running control plane — the intent owner, the output cache it publishes
to (built by translating the running intent), push hub, node registry and the ADS servicer on one
grpc.aio server. The reconcile loop, hot reload and admin API hang off it.

With `tls`, the port speaks only mTLS: client certificates must chain to the client CA, the files
are re-read when they change (`security/tls.py`), and each ADS stream's node identity must match
its certificate (`security/identity.py`). Without `tls`, SDS secrets (private keys) are sent to
no stream, or with `allow_plaintext_secrets` only to peers on loopback (`ads/server.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import grpc

from control_plane.acks.config_acks import ConfigAcks
from control_plane.acks.shared_acks import SharedAcks
from control_plane.ads.admission import plaintext_key_gate
from control_plane.ads.budget import certificate_or_address, peer_identity
from control_plane.ads.fanout import PushHub
from control_plane.ads.limits import DEFAULT_LIMITS, AdsLimits
from control_plane.ads.nodes import NodeRegistry
from control_plane.ads.off_loop import free_later
from control_plane.ads.server import AdsServicer, calls_ended, server_options
from control_plane.ads.snapshots import SnapshotCache
from control_plane.ads.sweeper import ConnectionSweeper
from control_plane.decisions.recorder import DecisionRecorder
from control_plane.desired.model import Desired
from control_plane.intent.owner import IntentOwner
from control_plane.intent.store import IntentStore
from control_plane.own_metrics.registry import BallastMetrics
from control_plane.security.peer import check_node_peer
from control_plane.security.tls import ReloadingCredentials
from control_plane.translate.served import (
    Served,
    served_pops,
    translate_served,
    used_capabilities,
)
from control_plane.xds_port.ads_observer import AdsObserver, Record

log = logging.getLogger(__name__)


def intent_and_cache(
    desired: Desired, *, store: IntentStore | None = None,
    recorder: DecisionRecorder | None = None, serving: Mapping[str, Desired] | None = None,
) -> tuple[IntentOwner, SnapshotCache[Served]]:
    """The intent owner (saving to `store`, recording to `recorder`; the PoPs of `serving` on
    their own desired states: a rollout restored) and the output cache it publishes to, whose
    entries are what the owner hands it translated (`translate/served.py`: translation is the
    only code the cache calls to build them)."""
    owner = IntentOwner(desired, store=store, recorder=recorder, serving=serving)
    cache = SnapshotCache(translate_served, served_pops, owner.served, used_capabilities,
                          release=free_later)
    owner.connect(cache)
    return owner, cache


class BallastServer:
    def __init__(
        self,
        desired: Desired,
        *,
        xds_address: str = "127.0.0.1:18000",
        record: Record | None = None,
        debounce: float = 0.1,
        max_delay: float = 1.0,
        metrics: BallastMetrics | None = None,
        limits: AdsLimits = DEFAULT_LIMITS,
        tls: ReloadingCredentials | None = None,
        store: IntentStore | None = None,
        recorder: DecisionRecorder | None = None,
        allow_plaintext_secrets: bool = False,
        serving: Mapping[str, Desired] | None = None,
        replica: str = "",
        peer_acks: Callable[[], Mapping[str, SharedAcks]] = dict,
    ) -> None:
        """`replica`, `peer_acks`: this replica's id among several and what the others share
        of their nodes (`config_acks.py`; alone: "" and nothing)."""
        self.xds_address = xds_address
        self.limits = limits
        self.tls = tls
        self.intent, self.cache = intent_and_cache(desired, store=store, recorder=recorder,
                                                   serving=serving)
        self.hub = PushHub(quiet=debounce, max_delay=max_delay)
        self.cache.add_listener(self.hub.changed)
        self.nodes = NodeRegistry()
        self.acks = ConfigAcks(self.nodes, self.cache,
                               lambda pop: self.intent.intent.desired_of(pop).digest,
                               replica=replica, peers=peer_acks)
        # a client's identity for the budgets of every service on the port
        self.identify = certificate_or_address if tls is not None else peer_identity
        # the port's connections: capped, swept of those without a valid stream, and an
        # identity's connections with valid streams budgeted
        self.connections = ConnectionSweeper(limits, self.identify)
        self.ads = AdsServicer(
            self.cache, self.hub, self.nodes,
            callbacks=AdsObserver(record=record, metrics=metrics, nacked=self.acks.nacked,
                                  answered=self.acks.touch),
            limits=limits,
            verify_peer=check_node_peer if tls is not None else None,
            identify=self.identify,
            key_gate=None if tls is not None else plaintext_key_gate(allow_plaintext_secrets),
            vouch=self.connections.vouch,
        )
        self.grpc: grpc.aio.Server | None = None
        self.port = 0
        self._services: list[Callable[[grpc.aio.Server], None]] = [self.ads.add_to]

    def add_service(self, register: Callable[[grpc.aio.Server], None]) -> None:
        """Another gRPC service on the same port (e.g. a MetricsService); call before start()."""
        self._services.append(register)

    async def start(self) -> None:
        """Bind and serve; `port` is the bound port (useful with an address ending in :0).

        The grpc.aio server is made here, on the running loop, with every registered service.
        """
        self.grpc = grpc.aio.server(options=server_options(self.limits))
        for register in self._services:
            register(self.grpc)
        try:
            if self.tls is None:
                self.port = self.grpc.add_insecure_port(self.xds_address)
            else:
                self.port = self.grpc.add_secure_port(self.xds_address, self.tls.credentials())
        except RuntimeError as err:  # grpc's word for "bind failed"
            raise OSError(f"cannot listen on {self.xds_address}: address in use?") from err
        if self.port == 0:
            raise OSError(f"cannot listen on {self.xds_address}")
        await self.grpc.start()
        if not self.xds_address.startswith("unix"):
            self.connections.start(self.port)
        host = self.xds_address.rsplit(":", 1)[0]
        log.info("serving xDS (ADS, SotW and delta) on %s:%d (%s), at most %d connections",
                 host, self.port, "mTLS" if self.tls is not None else "plaintext",
                 self.connections.rules.total)

    async def stop(self, grace: float = 1.0) -> None:
        """Refuse new streams, end open ones with UNAVAILABLE, then stop after `grace` s."""
        if self.grpc is None:
            return
        self.ads.close_streams()
        await self.connections.stop()
        await self.grpc.stop(grace)
        await calls_ended()  # the stopped calls' tasks end before the loop may
        log.info("xDS server stopped")
