"""Three PoPs on loopback for the rollout tests: Ballast in-process (or as `ballast serve`),
one real Envoy per PoP (lax's on delta xDS, the others SotW), demo origins and steady traffic
through every PoP. The canary PoP (ewr) may have more Envoys beside its own, each of an older
release (`canary_builds`: release -> binary; node `ewr-<release>`), sharing its listener port.

The desired state's `rollout:` policy takes ewr as the canary, then sjc (50 % of the rest),
then lax; each wave bakes `bake`. `rollout_desired` writes versions of it: `marker` adds a
classification rule (a route every PoP gets: a harmless change), `primary_port` moves the
primary origin (to a broken one: a harmful change), `read_timeout` sets the critical tier's (1ms:
a harmful change that keeps every address), `newer_filter` adds an HTTP filter whose
config only Envoy 1.37 and later accept (`NEWER_FILTER`: Envoy 1.36 NACKs it, 1.40 ACKs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from control_plane.decisions.read import iter_records
from control_plane.desired.filter_types import DEFAULT_ALLOWED
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.translate.bootstrap import ads_bootstrap
from control_plane.translate.capabilities import NEWEST_RELEASE
from harness.demo_origin import DemoOrigin, Fault
from harness.envoy_process import EnvoyProcess, free_port
from harness.traffic import steady_traffic, stop_tasks

POPS = ("ewr", "sjc", "lax")
TRAFFIC_PATHS = ("/api/checkout/cart", "/", "/img/a.png")

DESIRED = """\
pops:
  ewr: {{listen_address: 127.0.0.1, port_offset: 0}}
  sjc: {{listen_address: 127.0.0.1, port_offset: {sjc_offset}}}
  lax: {{listen_address: 127.0.0.1, port_offset: {lax_offset}}}
failover:
  interval: 1s
  window: 3s
  stale_after: 10s
  min_samples: 5
{tiers}access_log: {{sample_rate: 1.0}}  # every request logged: each tier's shed rate
origin_groups:
  shop:
    origins:
      primary: {{address: 127.0.0.1, port: {primary}}}
      secondary: {{address: 127.0.0.1, port: {secondary}}}
    preference:
      ewr: [primary, secondary]
      sjc: [primary, secondary]
      lax: [primary, secondary]
    health_check: {{interval: 1s, connect_timeout: 500ms, read_timeout: 1s}}
rollout:
  canary: [ewr]
  waves: [50%, 100%]
  bake: {bake}
  stats_flush_interval: 1s  # the Envoys' (start_envoys): the shortest bake is 2s
  # a loaded test machine moves p95 by hundreds of ms and may set off tier actions: the
  # tests' subjects are the waves, 5xx regressions and NACKs
  gates: {{min_samples: 5, ack_timeout: 30s, min_p95_increase: 5s, max_tier_action_onsets: 100}}
classification:
  default_tier: critical
  rules:
    - {{name: checkout, path_prefix: /api/checkout, tier: critical}}
{marker}listeners:
  - name: edge
    port: {listener}
    virtual_hosts:
      - {{name: shop, domains: ["*"], origin_group: shop}}
{newer_filter}"""

# An external processor whose request bodies go over gRPC (`request_body_mode: GRPC`, a
# BodySendMode value added in Envoy 1.37): Envoy 1.36 knows the filter (its node lists it, so
# Ballast's filter gate sends it) but not the value, and its proto validation refuses the
# listener ("value must be one of the defined enum values"). Harmless where accepted: headers
# are skipped, the traffic's GETs have no body, and a processor that cannot be reached (none
# is) lets requests through.
BAD_FILTER = """\
    http_filters:
      - name: envoy.filters.http.compressor
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor
"""  # no compressor library: every Envoy build NACKs it

EXT_PROC = "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"  # not allowed by default
NEWER_FILTER = """\
    http_filters:
      - name: ext-proc
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
          grpc_service: {envoy_grpc: {cluster_name: ext-proc}}
          failure_mode_allow: true
          processing_mode:
            request_header_mode: SKIP
            response_header_mode: SKIP
            request_body_mode: GRPC
"""


@dataclass(frozen=True)
class Ports:
    listeners: dict[str, int]
    primary: int
    secondary: int
    xds: int

    @classmethod
    def free(cls, origins: dict[str, DemoOrigin]) -> Ports:
        listener, sjc, lax = sorted(free_port() for _ in POPS)
        return cls({"ewr": listener, "sjc": sjc, "lax": lax}, origins["primary"].port,
                   origins["secondary"].port, free_port())


def rollout_desired(ports: Ports, *, marker: str | None = None, primary_port: int | None = None,
                    newer_filter: bool = False, bad_filter: bool = False,
                    bake: str = "2s", read_timeout: str | None = None) -> str:
    listener = ports.listeners["ewr"]
    return DESIRED.format(
        tiers="" if read_timeout is None else
        "tiers:\n  critical: {read_timeout: " + read_timeout + "}\n  normal: {}\n"
        "  background: {}\n",
        sjc_offset=ports.listeners["sjc"] - listener,
        lax_offset=ports.listeners["lax"] - listener,
        primary=ports.primary if primary_port is None else primary_port,
        secondary=ports.secondary,
        bake=bake,
        listener=listener,
        marker="" if marker is None else
        f"    - {{name: {marker}, path_prefix: /{marker}, tier: critical}}\n",
        newer_filter=(NEWER_FILTER if newer_filter else BAD_FILTER if bad_filter else ""),
    )


def start_envoys(xds_port: int, canary_builds: Mapping[str, str] | None = None
                 ) -> tuple[dict[str, EnvoyProcess], dict[str, EnvoyProcess]]:
    """(PoP -> its Envoy, node `<pop>-edge-1`, the installed release; release -> the canary
    PoP's Envoy of that build, node `ewr-<release>`)."""
    canary = POPS[0]
    nodes = [(pop, pop, f"{pop}-edge-1", NEWEST_RELEASE, None) for pop in POPS]
    nodes += [(release, canary, f"{canary}-{release}", release, binary)
              for release, binary in (canary_builds or {}).items()]
    started: dict[str, EnvoyProcess] = {}
    try:
        for key, pop, node, release, binary in nodes:
            admin = free_port()
            # lax's Envoy speaks delta xDS, the others SotW: ACKs and NACKs of both count
            bootstrap = ads_bootstrap(node_id=node, pop=pop, xds_port=xds_port,
                                      admin_port=admin, metrics_sink=True,
                                      needed_stats_only=True, stats_flush_interval_ms=1000,
                                      delta=pop == "lax", envoy_release=release)
            started[key] = EnvoyProcess(bootstrap, admin, binary=binary).start()
    except BaseException:
        for envoy in started.values():
            envoy.stop()
        raise
    return ({pop: started[pop] for pop in POPS},
            {release: started[release] for release in canary_builds or {}})


def admin_post(url: str, token: str | None) -> tuple[int, dict[str, Any]]:
    """`POST url` (no body) with the admin token, if any: the status and the JSON answer."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, method="POST", data=b"", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@dataclass
class RolloutFleet:
    service: BallastService | None
    origins: dict[str, DemoOrigin]
    envoys: dict[str, EnvoyProcess]  # PoP -> its Envoy (the installed release)
    ports: Ports
    path: Path
    state_dir: Path
    traffic: list[asyncio.Task[None]]
    stop: asyncio.Event
    statuses: Counter[int] = field(default_factory=Counter)
    canary_builds: dict[str, EnvoyProcess] = field(default_factory=dict)  # release -> Envoy

    def every_envoy(self) -> list[EnvoyProcess]:
        return [*self.envoys.values(), *self.canary_builds.values()]

    def nodes(self, pop: str) -> int:
        """How many Envoys `pop` has."""
        return 1 + (len(self.canary_builds) if pop == POPS[0] else 0)

    def start_traffic(self, rps: float = 20.0, pops: tuple[str, ...] = POPS) -> None:
        """Steady traffic through `pops`' listeners until the fleet stops (Envoys ready)."""
        self.traffic.extend(asyncio.create_task(steady_traffic(
            f"http://127.0.0.1:{self.ports.listeners[pop]}", TRAFFIC_PATHS, rps, self.stop,
            self.count_status)) for pop in pops)

    def count_status(self, status: int) -> None:
        """One answer of the steady traffic (0: the request failed)."""
        self.statuses[status] += 1

    def records(self, *kinds: str) -> list[dict[str, Any]]:
        return [r for r in iter_records(self.state_dir) if not kinds or r["kind"] in kinds]

    def write(self, **version: Any) -> None:
        self.path.write_text(rollout_desired(self.ports, **version))


@contextlib.asynccontextmanager
async def origins_and_envoys(tmp_path: Path, canary_builds: Mapping[str, str] | None = None
                             ) -> AsyncIterator[RolloutFleet]:
    """Demo origins (primary, secondary, broken: every answer a 503), the first desired state
    and an Envoy per PoP (and the canary PoP's `canary_builds`), pointed at a free xDS port.
    The caller starts Ballast on `ports.xds`, then the traffic (`start_traffic`)."""
    origins = {name: await DemoOrigin(name, free_port()).start()
               for name in ("primary", "secondary", "broken")}
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    envoys: dict[str, EnvoyProcess] = {}
    builds: dict[str, EnvoyProcess] = {}
    try:
        origins["broken"].set_fault(Fault(error_rate=1.0, status=503, fail_health=True))
        ports = Ports.free(origins)
        path = tmp_path / "desired.yaml"
        path.write_text(rollout_desired(ports))
        envoys, builds = start_envoys(ports.xds, canary_builds)
        fleet = RolloutFleet(None, origins, envoys, ports, path, tmp_path / "state",
                             traffic=tasks, stop=stop, canary_builds=builds)
        yield fleet
    finally:
        await stop_tasks(stop, tasks)
        for envoy in [*envoys.values(), *builds.values()]:
            envoy.stop()
        for origin in origins.values():
            await origin.stop()


@contextlib.asynccontextmanager
async def rollout_fleet(tmp_path: Path, *, admin_token: str | None = None,
                        canary_builds: Mapping[str, str] | None = None,
                        traffic: tuple[str, ...] = POPS) -> AsyncIterator[RolloutFleet]:
    """`origins_and_envoys` with Ballast in-process (no active probes: the gates judge what
    Envoys report; the rollout looked at every 200 ms), steady traffic through `traffic`."""
    token_file = None
    if admin_token is not None:
        token_file = tmp_path / "admin.token"
        token_file.write_text(admin_token + "\n")
        token_file.chmod(0o600)
    async with origins_and_envoys(tmp_path, canary_builds) as fleet:
        service = BallastService(ServiceConfig(
            desired_path=fleet.path, state_dir=fleet.state_dir,
            xds_address=f"127.0.0.1:{fleet.ports.xds}", admin_address="127.0.0.1:0",
            probes=False, reload_poll_s=0.1, rollout_poll_ms=200, admin_token_file=token_file,
            allowed_filters=DEFAULT_ALLOWED | {EXT_PROC}))  # `newer_filter` is an ext_proc
        await service.start()
        fleet.service = service
        try:
            for envoy in fleet.every_envoy():
                await asyncio.to_thread(envoy.wait_ready, 20)
            fleet.start_traffic(pops=traffic)
            yield fleet
        finally:
            await service.stop(0.5)
