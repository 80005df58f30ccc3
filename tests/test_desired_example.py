"""The shipped example loads, and every number the seeds give lands in the model."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from control_plane.desired import Desired, load_desired, parse_desired
from control_plane.desired.defaults import DEFAULT_TIERS
from control_plane.desired.model import FailoverPolicy, HeaderMatch, HealthCheck

EXAMPLE = Path(__file__).parent.parent / "examples" / "desired.yaml"

MINIMAL = """
pops:
  ewr: {}
  sjc:
origin_groups:
  shop:
    origins:
      primary: {address: 127.0.0.1, port: 8081}
      secondary: {address: origin.example.com, port: 8443, tls: true, sni: origin.example.com}
listeners:
  - {name: edge, port: 10000, virtual_hosts: [{name: shop, domains: ["*"], origin_group: shop}]}
"""


@pytest.fixture(scope="module")
def example() -> Desired:
    return load_desired(EXAMPLE)


def test_example_identity(example: Desired) -> None:
    assert example.source == str(EXAMPLE)
    assert example.digest == hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()
    assert example.pop_names == ("ewr", "sjc")
    assert [(p.listen_address, p.port_offset) for p in example.pops] == [
        ("127.0.0.1", 0), ("127.0.0.1", 1)]
    assert [(lis.name, lis.port) for lis in example.listeners] == [("edge", 10000)]
    assert example.listeners[0].virtual_hosts[0].origin_group == "shop"


SEED_NUMBERS = [
    # (tier, model field, source value) -- the tiers source's tiers, the queue-policy source's
    # watermarks
    ("critical", "share_percent", 70), ("normal", "share_percent", 25),
    ("background", "share_percent", 5),
    ("critical", "max_queue_depth", 2000), ("normal", "max_queue_depth", 8000),
    ("background", "max_queue_depth", 2000),
    ("critical", "queue_timeout_ms", 800), ("normal", "queue_timeout_ms", 1500),
    ("background", "queue_timeout_ms", 3000),
    ("critical", "connect_timeout_ms", 300), ("background", "connect_timeout_ms", 1000),
    ("critical", "read_timeout_ms", 2000), ("background", "read_timeout_ms", 8000),
    ("critical", "retries", 2), ("normal", "retries", 1), ("background", "retries", 0),
    ("critical", "sheddable", False), ("normal", "sheddable", False),
    ("background", "sheddable", True),
    ("critical", "retry_budget_percent", 15.0),
]


@pytest.mark.parametrize(("tier", "field", "value"), SEED_NUMBERS)
def test_seed_tier_numbers(example: Desired, tier: str, field: str, value: object) -> None:
    assert getattr(example.group("shop").tier(tier), field) == value


def test_seed_watermarks_and_priorities(example: Desired) -> None:
    tiers = example.group("shop").tiers
    assert [t.priority for t in tiers] == [0, 1, 2]
    for tier in tiers:
        assert tier.queue_policy.kind == "adaptive_lifo"
        assert (tier.queue_policy.adaptive_lifo.high_watermark,
                tier.queue_policy.adaptive_lifo.low_watermark) == (80, 60)


SEED_FAILOVER = [
    ("mode", "health_proportional"), ("interval_ms", 20_000), ("window_ms", 30_000),
    ("shift_step", 10), ("max_step", 15), ("hysteresis", 5), ("jitter", 2),
    ("min_warm_pool", 5), ("error_rate_threshold", 0.02), ("p95_threshold_ms", 800),
    ("breach_windows", 2), ("return_healthy_windows", 3), ("return_p50_ms", 250),
    ("return_speed", 0.5), ("stale_after_ms", 45_000),
]


@pytest.mark.parametrize(("field", "value"), SEED_FAILOVER)
def test_seed_failover_numbers(example: Desired, field: str, value: object) -> None:
    assert getattr(example.group("shop").failover, field) == value


def test_seed_group_and_health_check(example: Desired) -> None:
    group = example.group("shop")
    assert group.max_origin_concurrency == 120
    assert [(o.name, o.port) for o in group.origins] == [("primary", 8081), ("secondary", 8082)]
    assert group.preference == {"ewr": ("primary", "secondary"), "sjc": ("primary", "secondary")}
    assert group.health_check == HealthCheck(
        5000, 2000, 4000, "/healthz/cacheable", "/healthz", 200)


def test_seed_classification(example: Desired) -> None:
    assert example.default_tier == "critical"
    rules = [(r.name, r.tier, r.path_prefix, r.headers) for r in example.classification]
    assert rules == [
        ("checkout", "critical", "/api/checkout", ()),
        ("auth", "critical", "/auth", ()),
        ("prefetch", "background", None, (HeaderMatch("purpose", "exact", "prefetch"),)),
        ("x-prefetch", "normal", None, (HeaderMatch("x-purpose", "exact", "prefetch"),)),
        ("bots", "background", None, (HeaderMatch("user-agent", "contains", "bot"),)),
        ("next-image", "background", "/_next/image", ()),
    ]


def test_omitted_blocks_take_the_product_defaults() -> None:
    desired = parse_desired(MINIMAL, "minimal.yaml")
    group = desired.group("shop")
    assert group.tiers == DEFAULT_TIERS
    assert group.failover == FailoverPolicy()
    assert group.health_check == HealthCheck()
    assert group.max_origin_concurrency == 120
    assert group.preference == {"ewr": ("primary", "secondary"), "sjc": ("primary", "secondary")}
    assert desired.pop("sjc").listen_address == "0.0.0.0"
    assert desired.default_tier == "critical"
    assert desired.classification == ()
    assert group.origin("secondary").sni == "origin.example.com"


def test_example_equals_defaults_written_out(example: Desired) -> None:
    """Except hedging, which the example turns on for critical (off by default)."""
    minimal = parse_desired(MINIMAL, "minimal.yaml")
    hedges = {t.name: t.hedge_delay_ms for t in example.group("shop").tiers}
    assert hedges == {"critical": 50, "normal": 0, "background": 0}
    assert tuple(dataclasses.replace(t, hedge_delay_ms=0) for t in example.group("shop").tiers
                 ) == minimal.group("shop").tiers
    assert example.group("shop").failover == minimal.group("shop").failover


GROUP_OVERRIDES = """
    tiers:
      critical: {share: 60, queue_policy: {adaptive_lifo: {high_watermark: 200}}}
      normal: {share: 35, queue_policy: fifo}
    failover: {interval: 1m, error_rate_threshold: 0.05, min_warm_pool: 10%}
listeners:"""


def test_group_overrides_merge_field_by_field() -> None:
    text = "failover: {shift_step: 12}\n" + MINIMAL.replace("\nlisteners:", GROUP_OVERRIDES)
    group = parse_desired(text, "merge.yaml").group("shop")
    critical, normal = group.tier("critical"), group.tier("normal")
    assert critical.share_percent == 60 and critical.max_queue_depth == 2000
    assert critical.queue_policy.adaptive_lifo.high_watermark == 200
    assert critical.queue_policy.adaptive_lifo.low_watermark == 60
    assert normal.queue_policy.kind == "fifo" and normal.share_percent == 35
    assert group.failover.interval_ms == 60_000
    assert group.failover.shift_step == 12  # from the global block
    assert group.failover.error_rate_threshold == 0.05
    assert group.failover.min_warm_pool == 10


@pytest.mark.parametrize(("written", "millis"), [
    ("800ms", 800), ("2s", 2000), ("1.5s", 1500), ("1m", 60_000), ("1h", 3_600_000)])
def test_durations(written: str, millis: int) -> None:
    desired = parse_desired(f"failover: {{p95_threshold: {written}}}\n" + MINIMAL, "d.yaml")
    assert desired.group("shop").failover.p95_threshold_ms == millis


def test_header_names_are_lower_cased() -> None:
    text = MINIMAL + """classification:
  rules: [{name: ua, headers: [{name: User-Agent, prefix: curl}], tier: background}]
"""
    rule = parse_desired(text, "h.yaml").classification[0]
    assert rule.headers == (HeaderMatch("user-agent", "prefix", "curl"),)


def test_new_tier_with_every_field() -> None:
    text = """tiers:
  critical: {share: 90}
  normal: {share: 5}
  background: {share: 3}
  batch: {priority: 7, share: 2, max_queue_depth: 10, queue_timeout: 5s, connect_timeout: 1s,
          read_timeout: 30s, retries: 0, sheddable: true, retry_budget: 5%}
""" + MINIMAL.replace("\nlisteners:", "\n    max_origin_concurrency: 1000\nlisteners:")
    batch = parse_desired(text, "t.yaml").group("shop").tier("batch")
    assert (batch.priority, batch.share_percent, batch.read_timeout_ms) == (7, 2, 30_000)
    assert batch.retry_budget_percent == 5.0
    assert batch.queue_policy.kind == "adaptive_lifo"
