"""The product's defaults, taken from the sources (docs/architecture.md, "Sources" and "Where the
numbers come from").

The tiers source: tiers critical/normal/background with 70/25/5 of 120 origin connections, queue
depths 2000/8000/2000, queue timeouts 800/1500/3000 ms, connect 300 ms..1 s, read 2 s..8 s, retries
2/1/0. The queue-policy source: adaptive LIFO watermarks 80/60. The failover source: the failover
numbers (see model.FailoverPolicy).
"""

from __future__ import annotations

from control_plane.desired.model import QueuePolicy, Tier

MAX_ORIGIN_CONCURRENCY = 120

DEFAULT_TIERS: tuple[Tier, ...] = (
    Tier(
        name="critical",
        priority=0,
        share_percent=70,
        max_queue_depth=2000,
        queue_timeout_ms=800,
        connect_timeout_ms=300,
        read_timeout_ms=2000,
        retries=2,
        sheddable=False,
        queue_policy=QueuePolicy(),
    ),
    Tier(
        name="normal",
        priority=1,
        share_percent=25,
        max_queue_depth=8000,
        queue_timeout_ms=1500,
        connect_timeout_ms=500,
        read_timeout_ms=4000,
        retries=1,
        sheddable=False,
        queue_policy=QueuePolicy(),
    ),
    Tier(
        name="background",
        priority=2,
        share_percent=5,
        max_queue_depth=2000,
        queue_timeout_ms=3000,
        connect_timeout_ms=1000,
        read_timeout_ms=8000,
        retries=0,
        sheddable=True,
        queue_policy=QueuePolicy(),
    ),
)

DEFAULT_TIER_NAME = "critical"  # unmatched requests are critical: fail safe
