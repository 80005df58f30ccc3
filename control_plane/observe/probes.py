"""Active probes (the failover source): synthetic GETs to each origin's cacheable and uncacheable
paths (a gRPC service's origins: two health `Check`s, `grpc_probe.py`).

Probes run from Ballast itself, one prober for every PoP: an origin's probe result is the same
for all PoPs (the PoPs' own view of an origin comes from the passive signals). Every
`HealthCheck.interval_ms` each origin gets two GETs with connect / read timeouts (2 s / 4 s by
default); a probe passes when the status is the expected one. `success_share` is the rolling
share of passing probes over a window (pure, from the recorded results). Each passing probe's
time (request sent to answer read) is kept too: where passive traffic is too thin for evidence
(a standby at its warm pool), the probes' count and latencies fill in (`combine.py`).

TLS origins also get their certificate checked each round, before the GETs (the failover source: "If
your secondary origin hasn't been hit in hours, a stale or mismatched certificate will turn your
graceful failover into a hard outage"): one handshake verifying the chain and dates against the
origin's `ca_file` (a second, unverified one fetches the certificate when that fails), then
`certificates.assess` for names, pins and the expiry window. While the certificate fails, both GETs
of the round count as failed probes, so a standby that only sees warm-pool traffic is marked before
a shift would need it. Each check goes to `on_certificate` (the service turns changes into decision
records and keeps the gauges).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import aiohttp

from control_plane.desired.model import Desired, HealthCheck, Origin, OriginGroup
from control_plane.observe.certificates import CertificateCheck, CertificateStatus, assess
from control_plane.observe.grpc_probe import grpc_health_check
from control_plane.observe.source import wall_ms

log = logging.getLogger(__name__)

ProbeResult = tuple[int, bool]  # (time ms, passed)
# a gRPC origin gets as many probes a round as an HTTP origin's two paths: a 30 s window of
# 5 s rounds holds 12, what evidence needs (`decide/evidence.py`)
GRPC_CHECKS_PER_ROUND = 2


@dataclass(frozen=True)
class ProbeTarget:
    group: str
    origin: str
    base_url: str  # scheme://host:port
    health_check: HealthCheck
    sni: str | None = None
    host: str = ""
    port: int = 0
    ca_file: str | None = None  # TLS origins only
    certificate: CertificateCheck | None = None  # TLS origins only
    # an origin of a gRPC service: the health service's name its `Check`s ask about
    # (`grpc_probe.py`); None: an HTTP origin
    grpc_health: str | None = None


CertificateListener = Callable[[CertificateStatus, CertificateStatus | None], None]


def probe_targets(desired: Desired, serving: Mapping[str, Desired] | None = None
                  ) -> list[ProbeTarget]:
    """One target per (group, origin) of the desired state and of each other one a PoP still
    serves (`serving`, a rollout in progress): PoPs on the previous version keep their origins
    probed. Results are per (group, origin) for every PoP, so an origin both versions name is
    probed as the target (`desired`) has it (an address that moved: the new one; the PoPs
    still on the old one are judged at it by their passive signals)."""
    targets: dict[tuple[str, str], ProbeTarget] = {}
    versions = {desired.digest: desired} | {v.digest: v for v in (serving or {}).values()}
    for version in versions.values():
        for target in _targets(version):
            targets.setdefault((target.group, target.origin), target)
    return list(targets.values())


def _targets(desired: Desired) -> list[ProbeTarget]:
    """Every origin of every group; a gRPC service's through its health service, unless it is
    TLS (its origins may want the clients' certificates, which Ballast does not have: its
    load reports alone speak for it)."""
    grpc = [
        ProbeTarget(group=group.name, origin=origin.name, base_url=f"{origin.address}:"
                    f"{origin.port}", health_check=group.health_check, host=origin.address,
                    port=origin.port, grpc_health=group.grpc.health_service)
        for group in desired.grpc_services if group.grpc is not None and not group.grpc.tls
        for origin in group.origins
    ]
    return grpc + [
        ProbeTarget(
            group=group.name,
            origin=origin.name,
            base_url=f"{'https' if origin.tls else 'http'}://{origin.address}:{origin.port}",
            health_check=group.health_check,
            sni=origin.sni,
            host=origin.address,
            port=origin.port,
            ca_file=origin.ca_file if origin.tls else None,
            certificate=_certificate_check(group, origin) if origin.tls else None,
        )
        for group in desired.origin_groups if group.grpc is None
        for origin in group.origins
    ]


def _certificate_check(group: OriginGroup, origin: Origin) -> CertificateCheck:
    return CertificateCheck(
        expected_name=origin.expected_name,
        verify=origin.verify,
        spki_pins=origin.spki_pins,
        cert_pins=origin.cert_pins,
        expiry_warning_days=group.origin_tls.expiry_warning_days,
    )


async def fetch_certificate(
    target: ProbeTarget, verify: bool, timeout_s: float
) -> tuple[bytes | None, str | None]:
    """(the leaf certificate in DER, why the chain or dates did not verify) of a TLS target.
    The leaf is None when no handshake succeeded; the reason then says why."""
    server_name = target.sni or target.host
    chain_error = None
    if verify:
        try:
            context = ssl.create_default_context(cafile=target.ca_file)
        except (OSError, ssl.SSLError) as err:
            chain_error = f"cannot read ca_file {target.ca_file}: {err}"
        else:
            context.check_hostname = False  # names are matched by `assess`, as Envoy does
            try:
                return await _leaf(target, server_name, context, timeout_s), None
            except ssl.SSLCertVerificationError as err:
                chain_error = err.verify_message or str(err)
            except (OSError, TimeoutError, ssl.SSLError) as err:
                return None, f"TLS handshake failed: {err or type(err).__name__}"
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE
    try:
        return await _leaf(target, server_name, unverified, timeout_s), chain_error
    except (OSError, TimeoutError, ssl.SSLError) as err:
        return None, f"TLS handshake failed: {err or type(err).__name__}"


async def _leaf(
    target: ProbeTarget, server_name: str, context: ssl.SSLContext, timeout_s: float
) -> bytes:
    _, writer = await asyncio.wait_for(
        asyncio.open_connection(target.host, target.port, ssl=context,
                                server_hostname=server_name),
        timeout_s,
    )
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
    if not der:
        raise ssl.SSLError("the origin presented no certificate")
    return bytes(der)


def success_share(results: Iterable[ProbeResult], now_ms: int, window_ms: int) -> float | None:
    """Share of passing probes in (now_ms - window_ms, now_ms]; None when none ran."""
    inside = [passed for t, passed in results if now_ms - window_ms < t <= now_ms]
    if not inside:
        return None
    return sum(inside) / len(inside)


class Prober:
    """Probes every target every `interval_ms` (default: the shortest HealthCheck interval)."""

    def __init__(
        self,
        targets: Iterable[ProbeTarget],
        *,
        interval_ms: int | None = None,
        retention_ms: int = 300_000,
        clock: Callable[[], int] = wall_ms,
        on_certificate: CertificateListener | None = None,
    ) -> None:
        self.targets = list(targets)
        self.interval_ms = interval_ms
        self.retention_ms = retention_ms
        self.clock = clock
        self.on_certificate = on_certificate
        self._results: dict[tuple[str, str], deque[ProbeResult]] = {
            (t.group, t.origin): deque() for t in self.targets
        }
        # (time ms, answer ms) of the passing probes
        self._latencies: dict[tuple[str, str], deque[tuple[int, float]]] = {}
        self.certificates: dict[tuple[str, str], CertificateStatus] = {}

    def retarget(self, targets: Iterable[ProbeTarget]) -> None:
        """New desired state: probe these from the next round; results of a target that is
        gone or changed (address, paths, timeouts) are dropped, unchanged ones are kept."""
        fresh = list(targets)
        kept = set(fresh) & set(self.targets)
        self._results = {
            key: results
            for key, results in self._results.items()
            if any((t.group, t.origin) == key for t in kept)
        }
        self.certificates = {
            key: status
            for key, status in self.certificates.items()
            if any((t.group, t.origin) == key and t.certificate is not None for t in kept)
        }
        self._latencies = {key: found for key, found in self._latencies.items()
                           if key in self._results}
        self.targets = fresh

    def share(self, group: str, origin: str, now_ms: int, window_ms: int) -> float | None:
        return success_share(self.results(group, origin), now_ms, window_ms)

    def results(self, group: str, origin: str) -> tuple[ProbeResult, ...]:
        return tuple(self._results.get((group, origin), ()))

    def count(self, group: str, origin: str, now_ms: int, window_ms: int) -> int:
        """Probes of the origin in (now_ms - window_ms, now_ms]."""
        return sum(1 for t, _ in self._results.get((group, origin), ())
                   if now_ms - window_ms < t <= now_ms)

    def latencies(self, group: str, origin: str, now_ms: int, window_ms: int) -> list[float]:
        """Answer times (ms) of the origin's passing probes in the window."""
        return [ms for t, ms in self._latencies.get((group, origin), ())
                if now_ms - window_ms < t <= now_ms]

    def record(self, group: str, origin: str, at_ms: int, passed: bool,
               latency_ms: float | None = None) -> None:
        results = self._results.setdefault((group, origin), deque())
        results.append((at_ms, passed))
        while results and results[0][0] < at_ms - self.retention_ms:
            results.popleft()
        timed = self._latencies.setdefault((group, origin), deque())
        if passed and latency_ms is not None:
            timed.append((at_ms, latency_ms))
        while timed and timed[0][0] < at_ms - self.retention_ms:
            timed.popleft()

    def certificates_json(self) -> list[dict[str, object]]:
        """The latest certificate check of every TLS origin, by group and origin."""
        return [self.certificates[key].as_dict() for key in sorted(self.certificates)]

    async def probe_once(self, session: aiohttp.ClientSession) -> None:
        """One round: the certificates of TLS targets, then both paths of every target."""
        await asyncio.gather(*(self.check_certificate(target, target.certificate)
                               for target in self.targets if target.certificate is not None))
        await asyncio.gather(
            *(
                self._probe(session, target, path)
                for target in self.targets if target.grpc_health is None
                for path in (target.health_check.cacheable_path,
                             target.health_check.uncacheable_path)
            ),
            *(self._probe_grpc(target) for target in self.targets
              if target.grpc_health is not None for _ in range(GRPC_CHECKS_PER_ROUND)),
        )

    async def _probe_grpc(self, target: ProbeTarget) -> None:
        started = time.perf_counter()
        assert target.grpc_health is not None
        passed, why = await grpc_health_check(target.base_url, target.grpc_health,
                                              target.health_check)
        if not passed:
            log.info("probe of gRPC origin %s failed: %s", target.base_url, why)
        self.record(target.group, target.origin, self.clock(), passed,
                    (time.perf_counter() - started) * 1000)

    async def check_certificate(
        self, target: ProbeTarget, certificate: CertificateCheck
    ) -> CertificateStatus:
        check = target.health_check
        der, chain_error = await fetch_certificate(
            target, certificate.verify, (check.connect_timeout_ms + check.read_timeout_ms) / 1000)
        key = (target.group, target.origin)
        status = assess(target.group, target.origin, certificate, der, chain_error, self.clock())
        previous = self.certificates.get(key)
        self.certificates[key] = status
        if status.problem is not None:
            log.info("certificate of %s/%s: %s", target.group, target.origin, status.problem)
        if self.on_certificate is not None:
            self.on_certificate(status, previous)
        return status

    async def _probe(self, session: aiohttp.ClientSession, target: ProbeTarget, path: str) -> None:
        check = target.health_check
        timeout = aiohttp.ClientTimeout(
            sock_connect=check.connect_timeout_ms / 1000, sock_read=check.read_timeout_ms / 1000
        )
        passed = False
        started = time.perf_counter()
        try:
            async with session.get(
                target.base_url + path,
                timeout=timeout,
                allow_redirects=False,
                server_hostname=target.sni,
                # The certificate is judged by `check_certificate`, against the origin's own CA
                # file and name: the GET only tells whether the origin answers.
                ssl=target.certificate is None,
            ) as response:
                await response.read()
                passed = response.status == check.expected_status
                if not passed:
                    log.info("probe %s%s answered %d", target.base_url, path, response.status)
        except (aiohttp.ClientError, TimeoutError) as err:
            log.info("probe %s%s failed: %s", target.base_url, path, err or type(err).__name__)
        certificate = self.certificates.get((target.group, target.origin))
        if target.certificate is not None and (certificate is None or not certificate.passed):
            passed = False
        self.record(target.group, target.origin, self.clock(), passed,
                    (time.perf_counter() - started) * 1000)

    async def run(self) -> None:
        """Probe until cancelled; each round starts `interval` after the previous one started."""
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            while True:
                interval_ms = self.interval_ms or min(
                    (t.health_check.interval_ms for t in self.targets), default=5000
                )
                started = asyncio.get_running_loop().time()
                await self.probe_once(s)
                elapsed = asyncio.get_running_loop().time() - started
                await asyncio.sleep(max(0.0, interval_ms / 1000 - elapsed))
