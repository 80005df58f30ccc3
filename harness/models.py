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
        source="harness/models.py",
    )


def fleet_desired(pops: int, groups: int, origins: int = 2) -> Desired:
    """`pops` PoPs (p000…) and `groups` origin groups (g000…) of `origins` origins each, one
    virtual host per group; each PoP prefers a different origin first. For scale tests."""
    pop_names = [f"p{p:03d}" for p in range(pops)]
    names = [f"o{i}" for i in range(origins)]
    the_groups = tuple(
        OriginGroup(
            name=f"g{g:03d}",
            origins=tuple(
                Origin(name=name, address=f"10.{g // 250}.{g % 250}.{i + 1}", port=8080)
                for i, name in enumerate(names)
            ),
            preference={
                pop: tuple(names[p % origins:] + names[:p % origins])
                for p, pop in enumerate(pop_names)
            },
            max_origin_concurrency=MAX_ORIGIN_CONCURRENCY,
            tiers=DEFAULT_TIERS,
            failover=FailoverPolicy(),
            health_check=HealthCheck(),
        )
        for g in range(groups)
    )
    return Desired(
        pops=tuple(Pop(name=name, listen_address="127.0.0.1", port_offset=p)
                   for p, name in enumerate(pop_names)),
        origin_groups=the_groups,
        classification=CLASSIFICATION,
        default_tier=DEFAULT_TIER_NAME,
        listeners=(
            Listener(
                name="edge",
                port=10000,
                virtual_hosts=tuple(
                    VirtualHost(name=group.name, domains=(f"{group.name}.example",),
                                origin_group=group.name)
                    for group in the_groups
                ),
            ),
        ),
        source=f"harness/models.py fleet {pops}x{groups}",
    )
