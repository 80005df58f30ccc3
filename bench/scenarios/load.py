"""The load generator: open-loop Poisson arrivals per PoP with a realistic request mix.

The whole schedule (arrival times, PoP, kind, path, request number) is drawn up front from the
seed, on its own random stream, so every variant of a run gets exactly the same requests at the
same offsets. Requests are sent at their time whether or not earlier ones were answered (users
do not wait for each other); each answer is one `Sample`. Each request carries its number
(`x-bench-request`), from which the origins draw its latency and error, so a request costs the
same whichever variant and whichever order it arrives in. Popularity within a kind is Zipf
(s = 1.2), so a cold cache warms the way real ones do: the hot set first, the long tail later.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import random
import time
from dataclasses import dataclass
from functools import cache

import aiohttp

SHED_HEADER = "x-ballast-shed"  # Ballast's edge answered for a tier (shed_action, overflow)
# Envoy's own local reply when a circuit breaker overflows (a baseline's pool or queue is full):
# the edge answered instead of an origin, as Ballast's overflow does
OVERLOADED_HEADER = "x-envoy-overloaded"
REQUEST_HEADER = "x-bench-request"
CLIENT_TIMEOUT_S = 10.0  # a user gives up after this (above every edge's route timeout)
ZIPF_S = 1.2


@dataclass(frozen=True)
class Kind:
    name: str  # what the report calls it
    tier: str  # the tier the desired state classifies it into
    share: float  # of all requests
    path: str  # with {n}: the item
    items: int
    cacheable: bool
    headers: tuple[tuple[str, str], ...] = ()


# seed 000's mix: checkout API (critical, never cacheable), HTML pages (normal), bulk image
# revalidation (background)
MIX = (
    Kind("checkout", "critical", 0.2, "/api/checkout/cart/{n}", 200, False),
    Kind("html", "normal", 0.5, "/p/{n}.html", 2000, True),
    Kind("image", "background", 0.3, "/_next/image/{n}.png", 10000, True,
         (("purpose", "prefetch"),)),
)
KINDS = {k.name: k for k in MIX}


@dataclass(frozen=True)
class Surge:
    """Extra requests of one kind per PoP during part of the run (seed 000's flash sale)."""

    kind: str
    rps_per_pop: float
    start: float  # share of the run
    end: float


@dataclass(frozen=True)
class Request:
    n: int  # the request's number in the schedule (its identity at the origins)
    at: float  # seconds after the load starts
    pop: str
    kind: str
    path: str
    headers: tuple[tuple[str, str], ...]


# why a request did not get its intended answer (a 200 from an origin); "" = it did
CAUSES = ("shed", "deferred", "5xx", "timeout", "reset", "other")


@dataclass(frozen=True)
class Visit:
    """One attempt of a request at an origin as the origin saw it (`origin.Attempt`), times in
    seconds after the load started: `start` None when no worker took it."""

    origin: str
    host: int  # which of the origin's ports
    arrive: float
    start: float | None
    end: float | None
    result: str  # origin.ANSWERED, INJECTED, OVERLOADED, REFUSED, LEFT, ABANDONED
    mirror: bool = False  # a mirrored copy (the client never sees its answer)


@dataclass(frozen=True)
class Sample:
    at: float  # when it was sent, seconds after the load starts
    pop: str
    kind: str
    status: int  # 0: no answer (see `cause`)
    latency_ms: float
    origin: str  # x-origin of the answer, "" when none
    shed: bool  # the edge answered instead of an origin (x-ballast-shed, x-envoy-overloaded)
    timed_out: bool = False  # no answer within the client's timeout (else a reset, status 0)
    n: int = -1
    path: str = ""
    attempts: tuple[Visit, ...] = ()  # every attempt an origin saw, mirrored copies too

    @property
    def tier(self) -> str:
        return KINDS[self.kind].tier

    @property
    def end(self) -> float:
        """When the client had its answer (or gave up), seconds after the load starts."""
        return self.at + self.latency_ms / 1000

    @property
    def cause(self) -> str:
        """"" when the client got what it asked for; else why not."""
        if self.status == 200 and not self.shed:
            return ""
        if self.shed:
            return "deferred" if self.status == 202 else "shed"
        if self.status == 202:
            return "deferred"
        if self.status == 0:
            return "timeout" if self.timed_out else "reset"
        if self.status == 504:
            return "timeout"
        return "5xx" if self.status >= 500 else "other"


@cache
def _zipf_cdf(items: int) -> tuple[float, ...]:
    weights = [1 / i**ZIPF_S for i in range(1, items + 1)]
    total = sum(weights)
    return tuple(itertools.accumulate(w / total for w in weights))


def _zipf_item(rng: random.Random, items: int) -> int:
    """Item 1 hottest, Zipf(s = ZIPF_S)."""
    return min(items, bisect.bisect_left(_zipf_cdf(items), rng.random()) + 1)


def _arrivals(rng: random.Random, rate: float, start: float, end: float) -> list[float]:
    out, at = [], start + rng.expovariate(rate)
    while at < end:
        out.append(at)
        at += rng.expovariate(rate)
    return out


def schedule(
    seed: int, duration_s: float, rps: dict[str, float], mix: tuple[Kind, ...] = MIX,
    surges: tuple[Surge, ...] = (),
) -> list[Request]:
    """Every request of the run, in time order; the same for the same arguments."""
    rng = random.Random(f"schedule:{seed}")
    weights = [k.share for k in mix]
    drawn: list[tuple[float, str, Kind]] = []
    for pop, rate in sorted(rps.items()):
        for at in _arrivals(rng, rate, 0.0, duration_s):
            drawn.append((at, pop, rng.choices(mix, weights)[0]))
        for surge in surges:
            kind = KINDS[surge.kind]
            for at in _arrivals(rng, surge.rps_per_pop, surge.start * duration_s,
                                surge.end * duration_s):
                drawn.append((at, pop, kind))
    drawn.sort(key=lambda d: d[0])
    return [Request(n, at, pop, kind.name, kind.path.format(n=_zipf_item(rng, kind.items)),
                    kind.headers) for n, (at, pop, kind) in enumerate(drawn)]


async def _one(session: aiohttp.ClientSession, url: str, request: Request, started: float
               ) -> Sample:
    sent = time.monotonic()
    status, origin, shed, timed_out = 0, "", False, False
    headers = {**dict(request.headers), REQUEST_HEADER: str(request.n)}
    try:
        async with session.get(url + request.path, headers=headers) as response:
            await response.read()
            status = response.status
            origin = response.headers.get("x-origin", "")
            shed = SHED_HEADER in response.headers or OVERLOADED_HEADER in response.headers
    except TimeoutError:
        timed_out = True
    except aiohttp.ClientError:
        pass
    return Sample(sent - started, request.pop, request.kind, status,
                  (time.monotonic() - sent) * 1000, origin, shed, timed_out, request.n,
                  request.path)


async def run_load(
    requests: list[Request], base_urls: dict[str, str], started: float,
    timeout_s: float = CLIENT_TIMEOUT_S,
) -> list[Sample]:
    """Send `requests` on time, request.at seconds after `started` (time.monotonic()); the
    samples. The client's timeout is above every edge timeout, so a timeout here is the
    edge's too."""
    connector = aiohttp.TCPConnector(limit=2000, force_close=False)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)
    ) as session:
        tasks = []
        for request in requests:
            delay = request.at - (time.monotonic() - started)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(
                _one(session, base_urls[request.pop], request, started)))
        return list(await asyncio.gather(*tasks))
