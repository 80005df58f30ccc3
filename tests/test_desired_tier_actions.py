"""`tier_actions`: the tiers source's defaults, global block < group overrides, tier roles by
priority."""

from __future__ import annotations

from control_plane.desired import parse_desired
from control_plane.desired.model import TierActionPolicy

BASE = """\
pops:
  ewr: {{}}
{tiers}{global_block}origin_groups:
  shop:
    origins:
      primary: {{address: 127.0.0.1, port: 8081}}
{group_block}  api:
    origins:
      primary: {{address: 127.0.0.1, port: 8083}}
classification:
  default_tier: {default_tier}
listeners:
  - name: edge
    port: 10000
    virtual_hosts:
      - {{name: shop, domains: ["*"], origin_group: shop}}
"""


def policies(tiers: str = "", global_block: str = "", group_block: str = "",
             default_tier: str = "critical") -> dict[str, TierActionPolicy]:
    text = BASE.format(tiers=tiers, global_block=global_block, group_block=group_block,
                       default_tier=default_tier)
    desired = parse_desired(text, "test.yaml")
    return {group.name: group.tier_actions for group in desired.origin_groups}


def test_defaults_are_seed_000() -> None:
    assert policies() == {"shop": TierActionPolicy(), "api": TierActionPolicy()}
    assert TierActionPolicy() == TierActionPolicy(
        enabled=True, trigger_tier="critical", trigger_pending=10, for_ms=30_000,
        demote_tier="normal", demote_to="background", demote_share=50,
        shed_tier="background", recover_after_ms=60_000, stale_after_ms=45_000,
    )


def test_group_overrides_the_global_block_field_by_field() -> None:
    got = policies(
        global_block="tier_actions: {trigger_pending: 40, for: 1m, shed: none}\n",
        group_block="    tier_actions: {enabled: false, demote_share: 25%}\n",
    )
    assert got["api"] == TierActionPolicy(trigger_pending=40, for_ms=60_000, shed_tier=None)
    assert got["shop"] == TierActionPolicy(enabled=False, trigger_pending=40, for_ms=60_000,
                                           demote_share=25, shed_tier=None)


def test_custom_tiers_get_their_roles_by_priority() -> None:
    tiers = """\
tiers:
  interactive: {priority: 0, share: 80, max_queue_depth: 100, queue_timeout: 1s,
                connect_timeout: 1s, read_timeout: 1s, retries: 1}
  bulk: {priority: 5, share: 20, max_queue_depth: 100, queue_timeout: 1s,
         connect_timeout: 1s, read_timeout: 1s, retries: 0, sheddable: true}
"""
    got = policies(tiers=tiers, default_tier="interactive")["api"]
    # two tiers: nothing between them to demote; the least critical is shed (sheddable)
    assert (got.trigger_tier, got.demote_tier, got.demote_to, got.shed_tier) == (
        "interactive", None, None, "bulk"
    )
