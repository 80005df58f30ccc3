"""Active probes (seed 002): synthetic GETs to each origin's cacheable and uncacheable paths.

Probes run from Ballast itself, one prober for every PoP: an origin's probe result is the same
for all PoPs (the PoPs' own view of an origin comes from the passive signals). Every
`HealthCheck.interval_ms` each origin gets two GETs with connect / read timeouts (2 s / 4 s by
default); a probe passes when the status is the expected one. `success_share` is the rolling
share of passing probes over a window (pure, from the recorded results).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import aiohttp

from control_plane.desired.model import Desired, HealthCheck
from control_plane.observe.source import wall_ms

log = logging.getLogger(__name__)

ProbeResult = tuple[int, bool]  # (time ms, passed)


@dataclass(frozen=True)
class ProbeTarget:
    group: str
    origin: str
    base_url: str  # scheme://host:port
    health_check: HealthCheck
    sni: str | None = None


def probe_targets(desired: Desired) -> list[ProbeTarget]:
    """One target per (group, origin) of the desired state."""
    return [
        ProbeTarget(
            group=group.name,
            origin=origin.name,
            base_url=f"{'https' if origin.tls else 'http'}://{origin.address}:{origin.port}",
            health_check=group.health_check,
            sni=origin.sni,
        )
        for group in desired.origin_groups
        for origin in group.origins
    ]


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
    ) -> None:
        self.targets = list(targets)
        self.interval_ms = interval_ms
        self.retention_ms = retention_ms
        self.clock = clock
        self._results: dict[tuple[str, str], deque[ProbeResult]] = {
            (t.group, t.origin): deque() for t in self.targets
        }

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
        self.targets = fresh

    def share(self, group: str, origin: str, now_ms: int, window_ms: int) -> float | None:
        return success_share(self.results(group, origin), now_ms, window_ms)

    def results(self, group: str, origin: str) -> tuple[ProbeResult, ...]:
        return tuple(self._results.get((group, origin), ()))

    def record(self, group: str, origin: str, at_ms: int, passed: bool) -> None:
        results = self._results.setdefault((group, origin), deque())
        results.append((at_ms, passed))
        while results and results[0][0] < at_ms - self.retention_ms:
            results.popleft()

    async def probe_once(self, session: aiohttp.ClientSession) -> None:
        """One round: both paths of every target, concurrently."""
        await asyncio.gather(
            *(
                self._probe(session, target, path)
                for target in self.targets
                for path in (target.health_check.cacheable_path,
                             target.health_check.uncacheable_path)
            )
        )

    async def _probe(self, session: aiohttp.ClientSession, target: ProbeTarget, path: str) -> None:
        check = target.health_check
        timeout = aiohttp.ClientTimeout(
            sock_connect=check.connect_timeout_ms / 1000, sock_read=check.read_timeout_ms / 1000
        )
        passed = False
        try:
            async with session.get(
                target.base_url + path,
                timeout=timeout,
                allow_redirects=False,
                server_hostname=target.sni,
            ) as response:
                await response.read()
                passed = response.status == check.expected_status
                if not passed:
                    log.info("probe %s%s answered %d", target.base_url, path, response.status)
        except (aiohttp.ClientError, TimeoutError) as err:
            log.info("probe %s%s failed: %s", target.base_url, path, err or type(err).__name__)
        self.record(target.group, target.origin, self.clock(), passed)

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
