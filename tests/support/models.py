"""Desired-state fixtures built straight from the model (no YAML): for the pure rooms' tests."""

from __future__ import annotations

from control_plane.desired.defaults import (
    DEFAULT_TIER_NAME,
    DEFAULT_TIERS,
    MAX_ORIGIN_CONCURRENCY,
)
from control_plane.desired.model import (
    ClassificationRule,
    Desired,
    FailoverPolicy,
    HeaderMatch,
    HealthCheck,
    Listener,
    Origin,
    OriginGroup,
    Pop,
    VirtualHost,
)

CLASSIFICATION: tuple[ClassificationRule, ...] = (
    ClassificationRule(name="checkout", tier="critical", path_prefix="/api/checkout"),
    ClassificationRule(name="auth", tier="critical", path_prefix="/auth"),
    ClassificationRule(
        name="prefetch",
        tier="background",
        headers=(HeaderMatch(name="purpose", kind="exact", value="prefetch"),),
    ),
    ClassificationRule(
        name="x-prefetch",
        tier="normal",
        headers=(HeaderMatch(name="x-purpose", kind="exact", value="prefetch"),),
    ),
    ClassificationRule(
        name="bots",
        tier="background",
        headers=(HeaderMatch(name="user-agent", kind="contains", value="bot"),),
    ),
    ClassificationRule(name="next-image", tier="background", path_prefix="/_next/image"),
)


def shop_group(
    primary: Origin | None = None, secondary: Origin | None = None
) -> OriginGroup:
    """Group `shop`: origins primary/secondary on loopback; ewr prefers primary, sjc secondary."""
    first = primary or Origin(name="primary", address="127.0.0.1", port=8081)
    second = secondary or Origin(name="secondary", address="127.0.0.1", port=8082)
    return OriginGroup(
        name="shop",
        origins=(first, second),
        preference={"ewr": (first.name, second.name), "sjc": (second.name, first.name)},
        max_origin_concurrency=MAX_ORIGIN_CONCURRENCY,
        tiers=DEFAULT_TIERS,
        failover=FailoverPolicy(),
        health_check=HealthCheck(),
    )


def example_desired(group: OriginGroup | None = None) -> Desired:
    """PoPs ewr/sjc, group `shop`, the 3 default tiers, the seed rules, listener `edge` :10000."""
    the_group = group or shop_group()
    return Desired(
        pops=(
            Pop(name="ewr", listen_address="127.0.0.1", port_offset=0),
            Pop(name="sjc", listen_address="127.0.0.1", port_offset=1),
        ),
        origin_groups=(the_group,),
        classification=CLASSIFICATION,
        default_tier=DEFAULT_TIER_NAME,
        listeners=(
            Listener(
                name="edge",
                port=10000,
                virtual_hosts=(
                    VirtualHost(name="shop", domains=("*",), origin_group=the_group.name),
                ),
            ),
        ),
        source="tests/support/models.py",
    )
