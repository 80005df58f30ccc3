"""One time compression for every control timer of the incident bench.

Every timer that paces a decision or a change (the failover tick and window, probes, health
checks, outlier detection, the standby ramp's cold_after, the tier controller's `for` and
`recover_after`, the cache's memory, the flap period) runs COMPRESSION times faster than the
seed's value. Timers on the scale of one request (origin latency, connection set-up, route and
read timeouts, retry back-off) are not compressed: compressing them would change what each
request costs and what a user waits, which is what the bench measures. `TIMERS` lists each one
with its seed value and its value here; the reports print it.
"""

from __future__ import annotations

from dataclasses import dataclass

COMPRESSION = 10.0


def compressed(seconds: float) -> float:
    """A seed timer in bench seconds."""
    return seconds / COMPRESSION


def duration(seconds: float) -> str:
    """A desired-state duration: whole milliseconds."""
    return f"{round(seconds * 1000)}ms"


def envoy_duration(seconds: float) -> str:
    """A protobuf JSON Duration."""
    return f"{round(seconds, 3):g}s"


@dataclass(frozen=True)
class Timer:
    name: str
    seed_s: float  # the seed's (or the default's) value, real seconds
    source: str
    scaled: bool = True  # False: request-scale, kept real (`why`)
    why: str = ""

    @property
    def bench_s(self) -> float:
        return compressed(self.seed_s) if self.scaled else self.seed_s


REQUEST_SCALE = ("a request's own time: compressing it would change what the request costs "
                 "and what the user waits")
TIMERS = (
    Timer("failover interval (tick)", 20, "seed 002 `shift_interval: 20s`"),
    Timer("failover window", 30, "seed 002 \"30-second rolling window\""),
    Timer("failover stale_after", 45, "Ballast default (1.5 windows)"),
    Timer("failover damping_half_life", 900, "BGP route-flap damping's 15 min half-life"),
    Timer("standby_ramp cold_after", 90, "seed 002 hit ratio \"recovers in about 90 seconds\""),
    Timer("tier_actions interval (tier tick)", 5, "seed 000 \"export ... to our control plane "
          "every 5 seconds\""),
    Timer("tier_actions for", 30, "seed 000 \"for more than 30 seconds\""),
    Timer("tier_actions recover_after", 60, "Ballast default (twice `for`)"),
    Timer("Ballast probe interval", 5, "seed 002 \"active health checks every 5 seconds\""),
    Timer("baseline health check interval", 5, "seed 002 `interval: 5s`"),
    Timer("baseline health check timeout", 2, "seed 002 `timeout: 2s`",
          why="scaled with its interval; the shallow /healthz answers in well under 200 ms"),
    Timer("Ballast probe connect / read timeout", 2, "seed 002 2 s connect (4 s read → 400 ms)"),
    Timer("outlier detection interval", 10, "Envoy default"),
    Timer("outlier detection base ejection time", 30, "Envoy default"),
    Timer("cache eviction of an object not asked for", 600, "the bench's origin model",
          why="the warm-up it leaves (about 8 s at full load) is seed 002's ~90 s, compressed"),
    Timer("flap period (each phase)", 20, "seed 002 \"recovers for 20 seconds then throws 500s\""),
    Timer("origin latency, miss and API cost", 0.03, "seed 000 110 → 480 ms; ours 30 ms + work",
          scaled=False, why=REQUEST_SCALE),
    Timer("route / read timeouts", 4, "seed 002 2 s connect / 4 s read; seed 000 per tier",
          scaled=False, why=REQUEST_SCALE),
    Timer("connection set-up", 0.02, "TLS set-up to an origin", scaled=False, why=REQUEST_SCALE),
    Timer("retry back-off", 0.025, "Envoy default 25 ms base, 250 ms max", scaled=False,
          why=REQUEST_SCALE),
    Timer("origin abandons a request whose client left", 0.5, "the bench's origin model",
          scaled=False, why=REQUEST_SCALE),
)


def table() -> list[str]:
    """The report's section on time."""
    lines = [
        f"## Time: one compression, {COMPRESSION:.0f}x", "",
        f"Every control timer runs {COMPRESSION:.0f}x faster than the seed's (one bench second "
        f"stands for {COMPRESSION:.0f} real seconds); request-scale timers are real.", "",
        "| timer | seed / default | in the bench | source | note |", "|---|---:|---:|---|---|",
    ]
    for t in TIMERS:
        lines.append(f"| {t.name} | {_s(t.seed_s)} | {_s(t.bench_s)} | {t.source} | "
                     f"{'x1/' + format(COMPRESSION, '.0f') if t.scaled else 'real: ' + t.why}"
                     f"{' — ' + t.why if t.scaled and t.why else ''} |")
    return [*lines, ""]


def _s(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:g} s"
