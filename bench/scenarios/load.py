"""The load generator: open-loop Poisson arrivals per PoP with a realistic request mix.

The whole schedule (arrival times, PoP, kind, path) is drawn up front from the seed, so Ballast
and its baseline get exactly the same requests at the same offsets. Requests are sent at their
time whether or not earlier ones were answered (users do not wait for each other); each answer is
one `Sample`. Popularity within a kind is Zipf-like, so a cold cache warms the way real ones do:
the hot set first, the long tail for minutes.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import aiohttp

SHED_HEADER = "x-ballast-shed"


@dataclass(frozen=True)
class Kind:
    name: str  # what the report calls it
    tier: str  # the tier the desired state classifies it into
    share: float  # of all requests
    path: str  # with {n}: the item
    items: int
    headers: tuple[tuple[str, str], ...] = ()


# seed 000's mix: checkout API (critical), HTML pages (normal), bulk image revalidation (background)
MIX = (
    Kind("checkout", "critical", 0.2, "/api/checkout/cart/{n}", 200),
    Kind("html", "normal", 0.5, "/p/{n}.html", 600),
    Kind("image", "background", 0.3, "/_next/image/{n}.png", 3000,
         (("purpose", "prefetch"),)),
)


@dataclass(frozen=True)
class Request:
    at: float  # seconds after the load starts
    pop: str
    kind: str
    path: str
    headers: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Sample:
    at: float  # when it was sent, seconds after the load starts
    pop: str
    kind: str
    status: int  # 0: no answer (connection error, client timeout)
    latency_ms: float
    origin: str  # x-origin of the answer, "" when none
    shed: bool  # Ballast's edge answered for the tier controller (x-ballast-shed)


def _zipf_item(rng: random.Random, items: int) -> int:
    # inverse-CDF of a continuous 1/x popularity over 1..items: item 1 hottest
    return min(items, int(items ** rng.random()))


def schedule(
    seed: int, duration_s: float, rps: dict[str, float], mix: tuple[Kind, ...] = MIX
) -> list[Request]:
    """Every request of the run, in time order; the same for the same arguments."""
    rng = random.Random(seed)
    weights = [k.share for k in mix]
    out: list[Request] = []
    for pop, rate in sorted(rps.items()):
        at = rng.expovariate(rate)
        while at < duration_s:
            kind = rng.choices(mix, weights)[0]
            path = kind.path.format(n=_zipf_item(rng, kind.items))
            out.append(Request(at, pop, kind.name, path, kind.headers))
            at += rng.expovariate(rate)
    out.sort(key=lambda r: r.at)
    return out


async def _one(session: aiohttp.ClientSession, url: str, request: Request, started: float
               ) -> Sample:
    sent = time.monotonic()
    status, origin, shed = 0, "", False
    try:
        async with session.get(url + request.path, headers=dict(request.headers)) as response:
            await response.read()
            status = response.status
            origin = response.headers.get("x-origin", "")
            shed = SHED_HEADER in response.headers
    except (aiohttp.ClientError, TimeoutError):
        pass
    return Sample(sent - started, request.pop, request.kind, status,
                  (time.monotonic() - sent) * 1000, origin, shed)


async def run_load(
    requests: list[Request], base_urls: dict[str, str], timeout_s: float = 5.0
) -> tuple[list[Sample], float]:
    """Send `requests` on time; the samples and the wall-clock start (time.time())."""
    connector = aiohttp.TCPConnector(limit=1000, force_close=False)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)
    ) as session:
        wall, started = time.time(), time.monotonic()
        tasks = []
        for request in requests:
            delay = request.at - (time.monotonic() - started)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(
                _one(session, base_urls[request.pop], request, started)))
        samples = list(await asyncio.gather(*tasks))
    return samples, wall
