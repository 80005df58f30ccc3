"""The immutable desired-state model: what operators asked for, after validation.

Every value here is already checked and resolved (defaults applied, references known), so the
pure rooms (`translate`, `decide`) can trust it without re-validating. Durations are integer
milliseconds; shares and weights are integer percents.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal

QueuePolicyKind = Literal["fifo", "adaptive_lifo"]
FailoverMode = Literal["health_proportional", "linear", "exponential"]
HeaderMatchKind = Literal["exact", "prefix", "contains", "present"]
# How Envoy answers a shed tier's requests (the tiers source "serve stale or 202"): `reject` 503 +
# retry-after; `defer` 202 + retry-after (work a client can safely do later, e.g. prefetch);
# `stale` 503 + retry-after + `x-ballast-serve-stale` (a cache in front serves its stale copy).
ShedAction = Literal["reject", "defer", "stale"]
SHED_STATUS: dict[str, int] = {"reject": 503, "defer": 202, "stale": 503}
# A tier's default floor (`Tier.min_share_percent`): the tiers source's smallest share (P2's
# 5 %), so preemption leaves every tier at least one slot at the source's 20-connection scale
# and above.
MIN_SHARE_PERCENT = 5
TriggerKind = Literal["wait", "pending"]
WaitQuantile = Literal["p50", "p95", "p99"]


@dataclass(frozen=True)
class AdaptiveLifo:
    """The queue-policy source: LIFO once a pool's pending queue reaches `high`, FIFO again at
    or below `low`."""

    high_watermark: int = 80
    low_watermark: int = 60


@dataclass(frozen=True)
class QueuePolicy:
    """What the operator wants; translation falls back to FIFO for Envoys that lack LIFO."""

    kind: QueuePolicyKind = "adaptive_lifo"
    adaptive_lifo: AdaptiveLifo = field(default_factory=AdaptiveLifo)


@dataclass(frozen=True)
class Tier:
    """One request tier of an origin group: its own cluster, pool, breakers and queue policy."""

    name: str
    priority: int  # 0 = most critical
    share_percent: int  # of the group's max_origin_concurrency
    max_queue_depth: int  # -> circuit breaker max_pending_requests
    queue_timeout_ms: int
    connect_timeout_ms: int
    read_timeout_ms: int  # per try
    retries: int
    sheddable: bool
    queue_policy: QueuePolicy
    # the failover source: at most 15 % of requests may be retries
    retry_budget_percent: float = 15.0
    shed_action: ShedAction = "reject"  # how its requests are answered while it is shed
    # The tiers source "50ms for P0 before we attempt hedging to a secondary origin": an attempt not
    # answered within this delay gets a second one to another origin; 0 = no hedging.
    hedge_delay_ms: int = 0
    # The tier's floor: the share of the origin connections preemption by a more critical tier
    # never takes (the tiers source: "non-critical still makes progress"; "guarantee at least 1
    # dequeue per second per tier"), at most its own share (`OriginGroup.floor`).
    min_share_percent: int = MIN_SHARE_PERCENT


@dataclass(frozen=True)
class HealthCheck:
    """Active probes (the failover source): GETs every 5 s on a cacheable and an uncacheable
    path."""

    interval_ms: int = 5000
    connect_timeout_ms: int = 2000
    read_timeout_ms: int = 4000
    cacheable_path: str = "/healthz/cacheable"
    uncacheable_path: str = "/healthz"
    expected_status: int = 200


@dataclass(frozen=True)
class FailoverPolicy:
    """The failover source's gradual, asymmetric failover parameters."""

    mode: FailoverMode = "health_proportional"
    interval_ms: int = 20_000  # one reconcile tick per interval
    window_ms: int = 30_000  # passive signals' rolling window
    shift_step: int = 10  # weight points per interval when leaving
    max_step: int = 15  # hard cap per interval, whatever the mode
    hysteresis: int = 5  # ignore target moves smaller than this
    jitter: int = 2  # +/- per-PoP jitter on each step
    min_warm_pool: int = 5  # percent every standby origin always keeps
    error_rate_threshold: float = 0.02  # 5xx share over the window
    p95_threshold_ms: int = 800
    breach_windows: int = 2  # consecutive bad windows before leaving
    return_healthy_windows: int = 3  # consecutive good windows before returning
    return_p50_ms: int = 250
    return_speed: float = 0.5  # return moves at this fraction of the leave step
    stale_after_ms: int = 45_000  # metrics older than this hold weights (fail static)
    # Evidence (decide/evidence.py): a window with fewer samples (attempts, with probes filling
    # in; latency observations) neither breaches nor counts as healthy. 10: a standby's 12
    # probes of a 30 s window suffice, and one failure in 10 is no breach (lower bound 1.8 %).
    min_samples: int = 10
    # Abandoned attempts (decide/evidence.py): the share of an origin's attempts it never finished
    # (another attempt won: a hedge) whose lower bound breaches above this. Ordinary hedging loses a
    # few percent of a healthy origin's attempts; twice the failover source's "about 5 %
    # duplication" leaves room for them (measured: docs/benchmarks.md).
    abandon_threshold: float = 0.10
    # Compare, not only threshold: weight leaves a sick origin for any origin whose composite
    # score is higher by at least this much, even one that breaches a threshold too.
    compare_margin: float = 0.1
    # Flap damping per (PoP, origin), BGP route-flap damping's model and defaults (RFC 2439):
    # each healthy -> sick onset adds `damping_penalty`; the penalty halves every
    # `damping_half_life_ms`; at or above `damping_suppress` a return needs
    # `damping_return_windows` healthy windows instead of `return_healthy_windows`; below
    # `damping_reuse` the origin's flap history is forgotten.
    damping_penalty: int = 1000
    damping_half_life_ms: int = 900_000
    damping_suppress: int = 2000
    damping_reuse: int = 750
    damping_return_windows: int = 6


RampDegrade = Literal["hold", "back_off"]


@dataclass(frozen=True)
class StandbyRampPolicy:
    """The failover source's cold-standby ramp: how weight flows into a standby that has sat at its
    warm pool (the "cold" secondary of the source's binary-failover incident), and the cache-warming
    mirror that runs while it ramps."""

    enabled: bool = True
    schedule: tuple[int, ...] = (5, 10, 20, 40)  # the standby's share ceilings, one per interval
    cold_after_ms: int = 90_000  # at the warm pool this long = cold (source: ~90 s to warm)
    on_degrade: RampDegrade = "back_off"  # a standby breaching while it ramps: back off or hold
    mirror_percent: float = 5.0  # cacheable requests mirrored to a ramping standby (0: off)
    cacheable_routes: tuple[str, ...] | None = None  # route names mirrored; None: every route


AffinityKind = Literal["cookie", "header"]


@dataclass(frozen=True)
class Affinity:
    """The failover source's session affinity ("sticky sessions or JWTs pinned to a region"): a user
    stays on the origin it started on while the weights shift, unless that origin is sick. Envoy's
    stateful session filter names the origin in a cookie (or a header the client echoes back) set on
    the first answer; a request carrying it goes to that origin while Ballast reports it healthy,
    and by the weights (with a new cookie) once it is sick."""

    kind: AffinityKind
    name: str  # the cookie's name (case kept) or the header's (lower-case)
    ttl_ms: int = 0  # the cookie's lifetime; 0: a session cookie (cookies only)


@dataclass(frozen=True)
class Mirror:
    """A cache-warming mirror active for one origin group in one PoP: `percent` of the GET/HEAD
    requests of `routes` (None: every route) are copied to each origin of `origins`."""

    origins: tuple[str, ...]
    percent: float
    routes: tuple[str, ...] | None = None


@dataclass(frozen=True)
class TierActions:
    """What adaptive re-prioritization does to a group's routes while it is active.

    `demote_share` percent of the `demote_tier` routes' traffic goes to the `demote_to` tier's
    cluster; the routes of `shed_tier` are answered at the edge with 503 and `retry-after`
    (`retry_after_s`). None / 0: that part is off.
    """

    demote_tier: str | None = "normal"
    demote_to: str | None = "background"
    demote_share: int = 50
    shed_tier: str | None = "background"
    retry_after_s: int = 60
    # Utilization shedding: further tiers answered at the edge (each with its `shed_action`).
    shed_tiers: tuple[str, ...] = ()
    # Work-conserving lending: tier -> its per-Envoy concurrency limit (max_requests and
    # max_connections) while it borrows; tiers not named keep their guaranteed share.
    limits: tuple[tuple[str, int], ...] = ()
    # The HTTP status each shed tier is answered with (its `shed_action`); not named: 503.
    shed_status: tuple[tuple[str, int], ...] = ()
    # Queues bounded in time: tier -> its pending-queue limit (max_pending_requests) when the
    # origin's latency makes the tier's queue_timeout worth fewer than `max_queue_depth`.
    pending_limits: tuple[tuple[str, int], ...] = ()

    @property
    def shed(self) -> frozenset[str]:
        """Every tier answered at the edge while these actions are in force."""
        return frozenset(self.shed_tiers) | ({self.shed_tier} if self.shed_tier else set())

    def limit(self, tier: str) -> int | None:
        return dict(self.limits).get(tier)

    def with_floors(self, group: OriginGroup) -> TierActions:
        """These actions with every shed tier of `group` at its floor (`OriginGroup.floor`):
        its limit the floor, its queue at most as long (what finds the floor busy is answered
        at once with its `shed_action`). Idempotent."""
        if not self.shed:
            return self
        limits, pending = dict(self.limits), dict(self.pending_limits)
        for tier in group.tiers:
            if tier.name in self.shed:
                floor = group.floor(tier)
                limits[tier.name] = floor
                pending[tier.name] = min(pending.get(tier.name, floor), floor)
        order = [t.name for t in group.tiers]
        return replace(
            self,
            limits=tuple((t, limits[t]) for t in order if t in limits)
            + tuple(sorted((t, n) for t, n in limits.items() if t not in order)),
            pending_limits=tuple((t, pending[t]) for t in order if t in pending)
            + tuple(sorted((t, n) for t, n in pending.items() if t not in order)),
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "demote_tier": self.demote_tier,
            "demote_to": self.demote_to,
            "demote_share": self.demote_share,
            "shed_tier": self.shed_tier,
            "retry_after_s": self.retry_after_s,
            "shed_tiers": list(self.shed_tiers),
            "limits": dict(self.limits),
            "shed_status": dict(self.shed_status),
            "pending_limits": dict(self.pending_limits),
        }


@dataclass(frozen=True)
class TierActionPolicy:
    """The tiers source's adaptive re-prioritization of one origin group ("If P0 wait time exceeds
    35ms for more than 30 seconds, we automatically demote 50% of P1 to P2 and shed P2 entirely").

    The trigger (`trigger`): `wait`, the `trigger_wait_quantile` of the `trigger_tier`'s pool wait
    measured from Envoy's access logs above `trigger_wait_ms`; or `pending`, the tier cluster's
    `upstream_rq_pending_active` (worst Envoy) above `trigger_pending`. Held for `for_ms`; the
    actions are lifted after `recover_after_ms` without the trigger. Utilization shedding (the tiers
    source `shed_threshold: 0.85`): the group's origin concurrency in use above `shed_threshold` for
    `for_ms` sheds every sheddable tier; lifted once it stayed below `shed_lift_threshold` for
    `recover_after_ms`. Lending: unused guaranteed concurrency is lent to tiers that want more (see
    `decide/tiers.py`). Tier names are resolved (defaults by priority) when the file is read.
    """

    enabled: bool = True
    # the tier tick: the tiers source exports "queue depth, wait time, and origin p99 per priority
    # to our control plane every 5 seconds"; at most the failover interval (reconcile/reconcile.py)
    interval_ms: int = 5_000
    trigger_tier: str = "critical"
    trigger: TriggerKind = "wait"
    trigger_wait_ms: int = 35
    trigger_wait_quantile: WaitQuantile = "p95"
    # single-attempt samples a window needs for the wait trigger (else: `pending` for it); at
    # least what puts two samples at or above the quantile (decide/tiers.py)
    trigger_wait_min_samples: int = 20
    trigger_pending: int = 10
    for_ms: int = 30_000
    demote_tier: str | None = "normal"
    demote_to: str | None = "background"
    demote_share: int = 50
    shed_tier: str | None = "background"
    recover_after_ms: int = 60_000
    stale_after_ms: int = 45_000  # a trigger reading older than this holds the current action
    shed_threshold: float = 0.85
    shed_lift_threshold: float = 0.70
    lending: bool = True
    lend_headroom_percent: int = 10  # of a lender's guarantee, kept free for its own arrivals
    lend_step_percent: int = 5  # of max_origin_concurrency: smaller lending changes wait
    # a tier short of slots takes them from less critical tiers down to their floors
    preemption: bool = True

    def actions(self) -> TierActions:
        return TierActions(
            demote_tier=self.demote_tier if self.demote_share else None,
            demote_to=self.demote_to if self.demote_share else None,
            demote_share=self.demote_share if self.demote_tier and self.demote_to else 0,
            shed_tier=self.shed_tier,
            retry_after_s=max(1, self.recover_after_ms // 1000),
        )


SYSTEM_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # Debian/Ubuntu's system CA bundle
EXPIRY_WARNING_DAYS = 14


@dataclass(frozen=True)
class OriginTlsPolicy:
    """A group's settings for its TLS origins (the tiers source: "Keep Origin SSL Verification ...
    enabled even for internal origins"; the failover source: "Enforce strict checks on both origins
    ... so you don't discover an expired cert at minute two of an incident")."""

    ca_file: str = SYSTEM_CA_BUNDLE  # trusted CAs, a PEM file on the Envoy hosts
    expiry_warning_days: int = EXPIRY_WARNING_DAYS  # certificates closer to expiry fail probes


@dataclass(frozen=True)
class Origin:
    name: str  # also the EDS locality zone: letters, digits, '-', '_' (no dots)
    address: str
    port: int
    tls: bool = False
    sni: str | None = None
    # Verification of the origin's certificate (only with tls): on unless the operator wrote
    # `insecure_skip_verify: true`; chain to `ca_file`, a subject-alt-name equal to
    # `expected_name`, and, when pins are given, one of them.
    verify: bool = True
    ca_file: str = SYSTEM_CA_BUNDLE
    verify_name: str | None = None
    spki_pins: tuple[str, ...] = ()  # base64 SHA-256 of the SubjectPublicKeyInfo
    cert_pins: tuple[str, ...] = ()  # hex SHA-256 of the whole certificate (DER)

    @property
    def server_name(self) -> str:
        """The SNI Envoy sends: `sni`, else the address."""
        return self.sni or self.address

    @property
    def expected_name(self) -> str:
        """The name the certificate must carry as a subject alt name."""
        return self.verify_name or self.server_name


@dataclass(frozen=True)
class GrpcService:
    """What makes an origin group a gRPC service: proxyless gRPC clients dial it as
    `xds:///<target>` or `xds:///<target>:<port>`, and get its origins as weighted localities
    (`translate/grpc_resources.py`); Envoys get nothing of it. Its weights, ramp and rollout
    are the group's, as for any origin group.

    `port`: the port clients name in the target and the origins' port unless one sets its own.
    `tls`: the clients reach the origins over TLS, with the certificates of their bootstrap's
    certificate provider (gRFC A29). `max_requests`: concurrent requests per client to the
    service (gRFC A32; None: gRPC's default, 1024). `timeout_ms`: the longest a call may last
    (gRFC A31 `max_stream_duration`; 0: no limit). `health_service`: the service name
    Ballast's probes ask the origins' gRPC health service about ("": the whole server)."""

    target: str
    port: int
    tls: bool = False
    max_requests: int | None = None
    timeout_ms: int = 0
    health_service: str = ""

    @property
    def listener_names(self) -> tuple[str, str]:
        """The names clients ask for: the target as dialled, without and with the port."""
        return self.target, f"{self.target}:{self.port}"


@dataclass(frozen=True)
class OriginGroup:
    name: str
    origins: tuple[Origin, ...]
    # PoP name -> origin names, most preferred first; every PoP and every origin appears.
    preference: dict[str, tuple[str, ...]]
    max_origin_concurrency: int
    tiers: tuple[Tier, ...]  # resolved: global tier defaults merged with group overrides
    failover: FailoverPolicy
    health_check: HealthCheck
    tier_actions: TierActionPolicy = field(default_factory=TierActionPolicy)
    origin_tls: OriginTlsPolicy = field(default_factory=OriginTlsPolicy)
    standby_ramp: StandbyRampPolicy = field(default_factory=StandbyRampPolicy)
    affinity: Affinity | None = None  # off unless the group asks for it
    grpc: GrpcService | None = None  # a gRPC service (`grpc_services:`): no tiers, no Envoy

    def origin(self, name: str) -> Origin:
        return next(o for o in self.origins if o.name == name)

    def tier(self, name: str) -> Tier:
        return next(t for t in self.tiers if t.name == name)

    def home_weights(self, pop: str) -> GroupWeights:
        """The starting weights in `pop`: its preferred origin takes everything but the standby
        origins' warm pools."""
        return home_weights(self.preference[pop], self.failover.min_warm_pool)

    def guarantee(self, tier: Tier) -> int:
        """The tier's share of the origin connections, rounded up (70% of 120 -> 84): its
        per-Envoy concurrency when nothing is lent."""
        return math.ceil(tier.share_percent * self.max_origin_concurrency / 100)

    def floor(self, tier: Tier) -> int:
        """The slots preemption always leaves the tier: its `min_share` of the origin
        connections, rounded up (5% of 20 -> 1), at most its guarantee."""
        return min(self.guarantee(tier),
                   math.ceil(tier.min_share_percent * self.max_origin_concurrency / 100))


@dataclass(frozen=True)
class HeaderMatch:
    name: str  # lower-case header name
    kind: HeaderMatchKind
    value: str = ""  # unused for "present"


@dataclass(frozen=True)
class ClassificationRule:
    """Requests matching every condition go to `tier`. Rules are tried in order."""

    name: str
    tier: str
    path_prefix: str | None = None
    headers: tuple[HeaderMatch, ...] = ()


@dataclass(frozen=True)
class ExtraFilter:
    """An operator-added Envoy HTTP filter, inserted before the router (and before Ballast's
    own filters' router position): its name, the type URL of its typed config and that config
    as checked protobuf wire bytes (from the typed JSON the operator wrote)."""

    name: str
    type_url: str  # type.googleapis.com/<message>
    config: bytes

    @property
    def type_name(self) -> str:
        return self.type_url.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class VirtualHost:
    name: str
    domains: tuple[str, ...]
    origin_group: str
    # per-route configs of the listener's operator-added filters, for this host's routes:
    # `name` is the filter's name, `type_url`/`config` its per-route message
    typed_per_filter_config: tuple[ExtraFilter, ...] = ()


TlsVersion = Literal["1.2", "1.3"]
CipherPolicy = Literal["intermediate", "modern"]
ALPN_DEFAULT = ("h2", "http/1.1")


@dataclass(frozen=True)
class ServedCertificate:
    """A certificate a TLS listener serves (sent to its PoPs' Envoys as an SDS Secret named
    `secret_name`), read from `cert_file` and `key_file` when the desired state was loaded and
    checked then: the key matches, the dates hold, the SANs cover `hostnames`.

    `key_pem` is the private key: it goes only into the Secret sent over mTLS; renderings show
    `key_fingerprint` instead (`translate/secrets.py`)."""

    name: str
    secret_name: str  # "<listener>.<name>": listener names have no dots, so it is unique
    hostnames: tuple[str, ...]  # the SNI names it is served for; () = only the default
    cert_file: str
    key_file: str
    chain_pem: bytes = field(repr=False)
    key_pem: bytes = field(repr=False)
    fingerprint: str = ""  # sha256 (hex) of the leaf certificate's DER
    key_fingerprint: str = ""  # sha256 (hex, 16) of the key's PEM: what renderings show
    not_after_s: float = 0.0  # unix time the leaf expires
    subject: str = ""

    def named(self) -> ServedCertificate:
        """Only what names it (name, secret name, hostnames): what listeners are built from."""
        return ServedCertificate(self.name, self.secret_name, self.hostnames, "", "", b"", b"")


@dataclass(frozen=True)
class ListenerTls:
    """HTTPS on a listener: one filter chain per certificate, matched by SNI; the first
    certificate (or the one marked `default`) answers clients without a matching SNI."""

    certificates: tuple[ServedCertificate, ...]
    default: str  # the name of the certificate for clients without a matching SNI
    min_version: TlsVersion = "1.2"
    max_version: TlsVersion = "1.3"
    cipher_policy: CipherPolicy = "intermediate"
    alpn: tuple[str, ...] = ALPN_DEFAULT
    client_ca_file: str | None = None  # set: clients must present a certificate it signed
    client_ca_pem: bytes | None = field(default=None, repr=False)
    expiry_warning_days: int = EXPIRY_WARNING_DAYS


@dataclass(frozen=True)
class Listener:
    name: str
    port: int
    virtual_hosts: tuple[VirtualHost, ...]
    tls: ListenerTls | None = None
    pops: tuple[str, ...] | None = None  # the PoPs that serve it; None: every PoP
    redirect_to_https: bool = False  # plain listener: every request gets a 301 to https
    http_filters: tuple[ExtraFilter, ...] = ()

    def served_in(self, pop: str) -> bool:
        return self.pops is None or pop in self.pops

    @cached_property
    def shape(self) -> Listener:
        """This listener without its certificates' contents: what its Envoy listener and route
        configurations are built from (so a renewal re-builds only the Secret)."""
        if self.tls is None:
            return self
        return replace(self, tls=replace(
            self.tls, certificates=tuple(c.named() for c in self.tls.certificates)))


@dataclass(frozen=True)
class Pop:
    name: str  # Envoy node.locality.zone
    listen_address: str = "0.0.0.0"
    port_offset: int = 0  # added to every listener port (several PoPs on one host)


@dataclass(frozen=True)
class AccessLog:
    """Envoy access logs streamed to Ballast (gRPC AccessLogService on the xDS port) by nodes
    whose bootstrap asks for it (`ballast bootstrap --metrics-sink`): the measured pool wait."""

    sample_rate: float = 0.1  # share of requests each Envoy logs (independent per request)


RolloutStrategy = Literal["waves", "immediate"]
RenewalPolicy = Literal["immediate", "waves"]


@dataclass(frozen=True)
class RolloutGates:
    """What a wave of a rollout must show over its bake time to pass (`decide/gates.py`).

    A signal regresses when the wave's PoPs are worse by more than its threshold, with evidence
    (the weight controller's rules, `decide/evidence.py`), than every baseline that has
    evidence: the PoPs still on the previous version over the same time, and the wave's PoPs'
    own window before the change.
    """

    # 5xx rate: the lower confidence bound of the wave's rate above a baseline's rate by more than
    # this; the failover source's error_rate_threshold (2 %), where the weight controller leaves
    max_5xx_increase: float = 0.02
    # p95: the wave's p95 above a baseline's p95 times this AND by at least
    # `min_p95_increase_ms` (a 5 ms p95 doubling to 10 ms is no regression)
    max_p95_ratio: float = 1.5
    min_p95_increase_ms: int = 100
    # shed rate per tier (requests answered at the edge by tier actions): the lower bound of the
    # wave's rate above a baseline's by more than this (5 %: a tier action sheds whole tiers, so
    # a change that makes one fire moves the rate by far more)
    max_shed_increase: float = 0.05
    # tier-action onsets (a group's tier actions going from none to active) in a wave PoP beyond
    # a baseline's count: 0, any onset the baselines did not have regresses
    max_tier_action_onsets: int = 0
    # every node of the wave's PoPs ACKs the new version within this of the wave's start:
    # the measured sync of 10,000 nodes took 25 s (docs/architecture.md), warming 15 s
    ack_timeout_ms: int = 60_000
    # samples a window needs to count (FailoverPolicy.min_samples, the same evidence rule)
    min_samples: int = 10
    # a wave still without evidence this long after its bake ended pauses the rollout for the
    # operator (resume waits again, promote finishes, abort rolls back)
    evidence_timeout_ms: int = 600_000


@dataclass(frozen=True)
class RolloutPolicy:
    """How a new desired-state version reaches the PoPs (`decide/rollout.py`): a canary wave,
    then growing waves, each baked and judged by the gates; or all at once (`immediate`).

    Not served configuration: a change of this section alone changes no PoP's resources.
    """

    strategy: RolloutStrategy = "waves"
    canary: tuple[str, ...] = ()  # PoP names; (): the first PoP of the file
    # the other PoPs reached after each later wave, cumulative percents ending at 100
    waves: tuple[int, ...] = (50, 100)
    # each wave serves the new version this long before its gates can pass it: the weight
    # controller judges 30 s windows and needs breach_windows (2) of them to see a regression,
    # tier actions hold 30 s before they act; 5 min covers ten windows
    bake_ms: int = 300_000
    # how often the Envoys flush their stats (`ballast bootstrap`: 5 s): a wave's gate reads
    # only stats that postdate its ACKs, so a bake shorter than two flushes never judges one
    # full flush of the change's own traffic (checked at load)
    stats_flush_interval_ms: int = 5_000
    gates: RolloutGates = field(default_factory=RolloutGates)
    # a version that only renews certificates served for the same hostnames (`decide/rollout.py`,
    # `renewal`): every PoP at once once it validated (the key matches, the dates hold, the SANs
    # cover the hostnames), or in waves like any change
    renewals: RenewalPolicy = "immediate"

    @property
    def min_bake_ms(self) -> int:
        """The shortest bake that lets a gate judge one full stats flush after the change: the
        first flush after the ACKs still carries traffic served on the old version (its
        baseline, `rollout/rollouts.py` `own_starts`), the second is the change's own."""
        return 2 * self.stats_flush_interval_ms


@dataclass(frozen=True)
class Desired:
    pops: tuple[Pop, ...]
    origin_groups: tuple[OriginGroup, ...]
    classification: tuple[ClassificationRule, ...]
    default_tier: str  # unmatched requests: critical (fail safe)
    listeners: tuple[Listener, ...]
    # Where a request's own `x-ballast-tier` is believed (the tiers source: "tagging downstream
    # sub-requests with the parent's priority"): networks (CIDR) of the trusted upstreams whose
    # sub-requests carry the parent's tier. Empty: the header is never believed.
    trusted_priority_sources: tuple[str, ...] = ()
    access_log: AccessLog = field(default_factory=AccessLog)
    rollout: RolloutPolicy = field(default_factory=RolloutPolicy)  # how changes reach the PoPs
    source: str = "<memory>"  # file it came from
    digest: str = ""  # sha256 of the source bytes; identifies a desired-state version
    # when its certificate files were read and judged (unix s; 0: none were)
    loaded_at_s: float = field(default=0.0, compare=False)

    def pop(self, name: str) -> Pop:
        return next(p for p in self.pops if p.name == name)

    def group(self, name: str) -> OriginGroup:
        return next(g for g in self.origin_groups if g.name == name)

    @cached_property
    def extra_filter_types(self) -> frozenset[str]:
        """The type names of every operator-added HTTP filter (the capability gate's concern)."""
        return frozenset(f.type_name for listener in self.listeners
                         for f in listener.http_filters)

    @cached_property
    def grpc_services(self) -> tuple[OriginGroup, ...]:
        """The groups proxyless gRPC clients dial (`OriginGroup.grpc`)."""
        return tuple(g for g in self.origin_groups if g.grpc is not None)

    @cached_property
    def pop_names(self) -> tuple[str, ...]:
        """Computed once per (immutable) desired state: asked for on every weight change."""
        return tuple(p.name for p in self.pops)


# Per (PoP, origin group): origin name -> weight; the weights of a group sum to 100.
GroupWeights = dict[str, int]
PopWeights = dict[str, GroupWeights]  # origin group name -> weights


def home_weights(preference: tuple[str, ...], min_warm_pool: int) -> GroupWeights:
    """The split with no incident: standbys keep their warm pool, the preferred origin the rest."""
    first = 100 - min_warm_pool * (len(preference) - 1)
    return {name: first if index == 0 else min_warm_pool for index, name in enumerate(preference)}
