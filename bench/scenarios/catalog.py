"""The scenarios: what the origins do over the run, the load, and what the report looks at.

Every control timer is compressed by `timers.COMPRESSION` (10x: a failover tick every 2 s over
3 s windows for seed 002's 20 s over 30 s), the script's phases too (a flap phase of 2 s for the
seed's 20 s), and so is each incident's length: as long as its seed's, divided by the same
factor (seed 000's 8-minute slowdown lasts 48 s); request-scale times are real
(`bench/scenarios/timers.py`).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from bench.scenarios.load import Surge
from bench.scenarios.origin import Behaviour, OriginSpec
from bench.scenarios.runner import Scenario
from bench.scenarios.stack import FAILOVER_BASELINES, PRIORITY_BASELINES
from bench.scenarios.timers import COMPRESSION, compressed

HEALTHY = Behaviour(p50_ms=30.0)
CACHE_TTL_S = compressed(600)  # an object not asked for in 10 min (real) is evicted
# seed 002's origins: a cache in front of backend work; cacheable misses and the uncacheable
# API cost backend time. The primary is big and warm. The standby is as good once warm (its hit
# ratio climbs to the primary's within ~8 s at full load: seed 002's "about 90 seconds") but
# sized for its usual share: 8 workers, 32 waiting, 48 connections, a TLS set-up on a worker per
# new connection, and it starts cold. Cold (every cacheable request a miss) it serves about 30
# requests/s, warm about 130: a flip of the whole load (100/s) overloads it until it has warmed.
PRIMARY = OriginSpec(cache_ttl_s=CACHE_TTL_S, miss_ms=250.0, api_ms=40.0, endpoints=4)
STANDBY = OriginSpec(workers=8, max_waiting=32, max_connections=48, connect_ms=20.0,
                     cache_ttl_s=CACHE_TTL_S, miss_ms=250.0, api_ms=40.0, warm=False,
                     endpoints=4)
ORIGINS = {"primary": PRIMARY, "secondary": STANDBY}
FAILOVER_VARIANTS = ("ballast", *FAILOVER_BASELINES)
# seed 002's incident: the primary bleeds for as long as the seed's gradual controller needs to
# drain it ("a full drain in about 3 minutes"), then stays sick as long again, long enough for
# the standby's warm-up ("hit ratio recovers in about 90 seconds") and a slow return to be
# judged: 6 minutes, 36 s here, after 1 minute (6 s) of health
PRE_S = compressed(60)
GROW_S = compressed(180)
HOLD_S = compressed(180)
SEED_002_S = PRE_S + GROW_S + HOLD_S
SEED_002_LENGTH = (
    "Seed 002 gives no end to its incidents; it drains a sick primary in \"about 3 minutes\" and "
    "warms a standby in \"about 90 seconds\". The incident here lasts 6 minutes (36 s at the "
    "bench's 10x): 3 minutes of growing bleed, 3 more at its worst, after 1 minute of health.")
STANDBY_NOTE = (
    "Whether a baseline's standby falls over depends on how long a flip lasts. Outlier "
    "detection ejects the failing primary for its base ejection time (3 s here, Envoy's 30 s "
    "real) times its number of ejections, then lets it back, and retries go to the other "
    "priority: the standby carries the whole load only between the primary's returns, and its "
    "wait line absorbs part of each burst. \"The standby: did it fall over?\" shows per run "
    "whether its wait line filled (peak load against workers + waiting) and its connections "
    "reached their cap, and what share of its answers failed after it first took half the "
    "load; seed 002's collapse is a flip that stays.")
BLEED_START, BLEED_FULL = PRE_S / SEED_002_S, (PRE_S + GROW_S) / SEED_002_S
RPS_PER_POP = 50.0
CREEP_MS_PER_MIN = 50.0  # seed 002: "50ms of extra TTFB creeping up every minute"


def _bleed(share: float, start: float = BLEED_START, full: float = BLEED_FULL,
           worst: float = 0.6, pops: tuple[str, ...] = (), duration_s: float = SEED_002_S
           ) -> dict[str, Behaviour]:
    """Seed 002's slow bleed: from `start` the primary's 5xx rate climbs to `worst`, reaching
    it at `full` and staying there, and its time to first byte creeps up by 50 ms per (real)
    minute all along."""
    if share < start:
        return {"primary": HEALTHY, "secondary": HEALTHY}
    x = min(1.0, (share - start) / (full - start))
    minutes = (share - start) * duration_s * COMPRESSION / 60
    primary = Behaviour(p50_ms=30.0 + CREEP_MS_PER_MIN * minutes, error_rate=worst * x,
                        pops=pops)
    return {"primary": primary, "secondary": HEALTHY}


FAILOVER = Scenario(
    name="failover",
    seed_ref="002",
    summary=(
        f"The primary origin slow-bleeds: from {PRE_S:g} s its 5xx rate climbs to 60 % over "
        f"{GROW_S:g} s (3 minutes real) and stays there for {HOLD_S:g} s more, while its time "
        "to first byte creeps up by 50 ms per real minute (seed 002), +300 ms at the end; its "
        "shallow /healthz keeps answering 200. The secondary is healthy but starts with a "
        f"cold cache and is sized for its usual share ({STANDBY.workers} workers, "
        f"{STANDBY.max_waiting} waiting, {STANDBY.max_connections} connections)."
    ),
    pops=("ewr", "sjc"),
    origins=ORIGINS,
    duration_s=SEED_002_S,
    rps_per_pop=RPS_PER_POP,
    incident=(BLEED_START, 1.0),
    script=_bleed,
    variants=FAILOVER_VARIANTS,
    notes=(STANDBY_NOTE,),
    seed_length=SEED_002_LENGTH,
)

REGIONAL = Scenario(
    name="regional",
    seed_ref="002",
    summary=(
        "Only PoP ewr's path to the primary fails (the same slow bleed as `failover`, but only "
        "requests through ewr see it); through sjc the primary stays healthy. The secondary is "
        "cold and capped as in `failover`."
    ),
    pops=("ewr", "sjc"),
    origins=ORIGINS,
    duration_s=SEED_002_S,
    rps_per_pop=RPS_PER_POP,
    incident=(BLEED_START, 1.0),
    script=partial(_bleed, pops=("ewr",)),
    variants=FAILOVER_VARIANTS,
    seed_length=SEED_002_LENGTH,
)

FLAP_PERIOD_S = compressed(20)  # seed 002: "recovers for 20 seconds then throws 500s again"
FLAP_DURATION_S = SEED_002_S


def _flap(share: float, duration_s: float = FLAP_DURATION_S, period_s: float = FLAP_PERIOD_S,
          error_rate: float = 0.5, start_s: float = PRE_S) -> dict[str, Behaviour]:
    """From `start_s` the primary alternates: `period_s` unhealthy (`error_rate` 5xx, TTFB
    +300 ms), `period_s` healthy."""
    t = share * duration_s - start_s
    if t < 0 or int(t // period_s) % 2:
        return {"primary": HEALTHY, "secondary": HEALTHY}
    return {"primary": Behaviour(p50_ms=330.0, error_rate=error_rate), "secondary": HEALTHY}


FLAP = Scenario(
    name="flap",
    seed_ref="002",
    summary=(
        f"From {PRE_S:g} s the primary flaps: {FLAP_PERIOD_S:g} s unhealthy (50 % 5xx, "
        f"time to first byte +300 ms), {FLAP_PERIOD_S:g} s healthy, again and again. The "
        "secondary is cold and capped as in `failover`. The question is how much the weights "
        "oscillate: a binary failover flips 100 points each time its checks agree."
    ),
    pops=("ewr", "sjc"),
    origins=ORIGINS,
    duration_s=FLAP_DURATION_S,
    rps_per_pop=RPS_PER_POP,
    incident=(PRE_S / FLAP_DURATION_S, 1.0),
    script=_flap,
    variants=FAILOVER_VARIANTS,
    seed_length=SEED_002_LENGTH.replace("3 minutes of growing bleed, 3 more at its worst",
                                        "nine cycles of 20 s sick, 20 s healthy"),
)

RESTART = replace(
    FAILOVER,
    name="restart",
    summary=FAILOVER.summary + (
        " In the middle of the shift (at 45 % of the run) Ballast is killed with SIGKILL and "
        "started again 1 s later (10 s real) on the same state directory. Envoys keep their "
        "last configuration meanwhile; the report compares the errors around the restart."),
    kill_at=0.45,
    restart_after_s=compressed(10),
    notes=(),
)

PRIORITY_CAP = 20  # the origin's worker cap = max_origin_concurrency
# seed 000: "origin P50 jumped from 110ms to 480ms for 8 minutes": 48 s here, after 80 s (8 s)
# of health and before 60 s (6 s) of recovery
SLOW_BEFORE_S, SLOW_S, SLOW_AFTER_S = compressed(80), compressed(480), compressed(60)
PRIORITY_S = SLOW_BEFORE_S + SLOW_S + SLOW_AFTER_S
SLOW_START, SLOW_END = SLOW_BEFORE_S / PRIORITY_S, (SLOW_BEFORE_S + SLOW_S) / PRIORITY_S
PRIORITY_RPS = 40.0
# checkout 8 + 21 = 29 requests/s x 0.51 s (the mean at p50 480 ms) = 14.8 at once: just over
# its share (14), so its latency depends on the scheduler giving it a slot or two more
CHECKOUT_SURGE = 21.0


def _slow_origin(share: float, start: float = SLOW_START, end: float = SLOW_END
                 ) -> dict[str, Behaviour]:
    """Seed 000: the origin's p50 rises from 110 ms to 480 ms for a period, then recovers."""
    return {"primary": Behaviour(p50_ms=480.0 if start <= share < end else 110.0)}


PRIORITY = Scenario(
    name="priority",
    seed_ref="000",
    summary=(
        f"One origin with {PRIORITY_CAP} workers (up to 200 more requests wait inside it; a "
        "request whose client left is dropped from the wait line and stops costing work "
        f"after 0.5 s). Its p50 is 110 ms, 480 ms from {SLOW_BEFORE_S:g} s to "
        f"{SLOW_BEFORE_S + SLOW_S:g} s ({SLOW_S:g} s: seed 000's 8-minute regression), then 110 "
        f"ms again. Load: {PRIORITY_RPS:.0f} requests/s of the mix, and "
        f"during the slowdown a checkout surge of {CHECKOUT_SURGE:.0f} requests/s more (a flash "
        "sale): checkout alone then needs about 15 workers at once, more than its 70 % share "
        f"(14), and all traffic together about 31, more than the origin's {PRIORITY_CAP}."
    ),
    pops=("ewr",),
    origins={"primary": OriginSpec(workers=PRIORITY_CAP, max_waiting=200,
                                   healthy_p50_ms=110.0)},
    duration_s=PRIORITY_S,
    rps_per_pop=PRIORITY_RPS,
    incident=(SLOW_START, SLOW_END),
    seed_length=("Seed 000's regression lasted 8 minutes (\"origin P50 jumped from 110ms to "
                 "480ms for 8 minutes\"); here 48 s, at the bench's 10x."),
    script=_slow_origin,
    origin_concurrency=PRIORITY_CAP,
    variants=("ballast", *PRIORITY_BASELINES),
    surges=(Surge("checkout", CHECKOUT_SURGE, SLOW_START, SLOW_END),),
    standby="",
    notes=(
        "Seed 000's own numbers, for reference: checkout p95 under 900 ms with tiers against "
        "3.1 s with one FIFO queue, during a period when the origin's p50 went from 110 to "
        "480 ms.",
    ),
)

# in the order `all` runs them: the seeds' central comparisons first
SCENARIOS = {s.name: s for s in (FAILOVER, PRIORITY, FLAP, REGIONAL, RESTART)}


SMOKE_S = 24.0


def _smoke_bleed(share: float, pops: tuple[str, ...] = ()) -> dict[str, Behaviour]:
    """A bleed in seconds: 0 → 30 % 5xx (TTFB +300 ms) from 20 % to 50 % of the run, then the
    primary fails hard (95 %) so that every variant acts. The hard half lasts 12 s: the binary
    baseline's outlier detection first ejected the primary 0.7 to 4.7 s into it (12 runs), so
    with 9.6 s a loaded run could end before the baseline flipped."""
    if share < 0.2:
        return {"primary": HEALTHY, "secondary": HEALTHY}
    x = min(1.0, (share - 0.2) / 0.3)
    primary = Behaviour(p50_ms=30.0 + 300.0 * x, error_rate=0.3 * x, pops=pops)
    if share >= 0.5:
        primary = Behaviour(p50_ms=330.0, error_rate=0.95, pops=pops)
    return {"primary": primary, "secondary": HEALTHY}


def smoke(scenario: Scenario) -> Scenario:
    """The test suite's variant: 24 s (priority 26 s), 20 requests/s per PoP, Ballast and the
    first baseline only, `_smoke_bleed`, so every variant acts within seconds (Ballast needs two
    breached 3 s windows and a 2 s tick after its start-up). The secondary starts warm: in
    seconds its warm pool cannot warm it, which is the full run's business. Priority's slowdown
    lasts 21 s: the FIFO queue's backlog needs about 10 s of it to pass its 4 s timeout, and
    with a 10 s slowdown both variants failed about 10 % of checkout (Ballast's are sheds of
    what its critical queue cannot serve within its 800 ms `queue_timeout`), a coin toss."""
    variants = scenario.variants[:2]
    if scenario.name == "priority":  # slow from 2.6 s to 23.4 s of 26 s
        return replace(scenario.scaled(26.0, scenario.rps_per_pop,
                                       partial(_slow_origin, start=0.1, end=0.9), (0.1, 0.9)),
                       surges=(Surge("checkout", CHECKOUT_SURGE, 0.1, 0.9),),
                       variants=variants)
    pops = scenario.script(1.0)["primary"].pops
    origins = {**scenario.origins, "secondary": replace(scenario.origins["secondary"], warm=True)}
    script = partial(_smoke_bleed, pops=pops)
    incident = (0.2, 1.0)
    if scenario.name == "flap":  # 2 s down (95 % 5xx), 2 s up
        script = partial(_flap, duration_s=SMOKE_S, period_s=FLAP_PERIOD_S, error_rate=0.95,
                         start_s=0.1 * SMOKE_S)
        incident = (0.1, 1.0)
    # restart: kill at 30 % (7 s) so the restarted Ballast (start-up takes seconds on a loaded
    # machine, then a tick every 2 s) has over 15 s to record its decisions for the PoPs
    kill_at = None if scenario.kill_at is None else 0.3
    return replace(scenario.scaled(SMOKE_S, 20.0, script, incident), origins=origins,
                   variants=variants, kill_at=kill_at)
