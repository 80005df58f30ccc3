"""The `rollout:` section: defaults with their reasons, every knob, errors at file:line:path, and
no served-config change from it alone."""

from __future__ import annotations

import pytest

from control_plane.cli.translate_options import DEFAULT_ENVOY_RELEASE, release_capabilities
from control_plane.desired import DesiredStateError, parse_desired
from control_plane.desired.model import FailoverPolicy, RolloutGates, RolloutPolicy
from control_plane.translate import render_json, translate_pop

BASE = """\
pops:
  ewr: {{}}
  sjc: {{port_offset: 1}}
  lhr: {{port_offset: 2}}
origin_groups:
  shop:
    origins:
      primary: {{address: 127.0.0.1, port: 8081}}
classification:
  default_tier: critical
listeners:
  - name: edge
    port: 10000
    virtual_hosts:
      - {{name: shop, domains: ["*"], origin_group: shop}}
{rollout}"""


def policy(rollout: str = "") -> RolloutPolicy:
    return parse_desired(BASE.format(rollout=rollout), "test.yaml").rollout


def problems(rollout: str) -> list[str]:
    with pytest.raises(DesiredStateError) as caught:
        parse_desired(BASE.format(rollout=rollout), "test.yaml")
    return [str(p) for p in caught.value.problems]


def test_defaults_are_canary_then_half_then_all_baked_five_minutes() -> None:
    got = policy()
    assert got == RolloutPolicy()
    assert (got.strategy, got.canary, got.waves, got.bake_ms) == ("waves", (), (50, 100), 300_000)
    assert got.renewals == "immediate"  # a renewal alone: every PoP at once after validation
    # the gates are tied to the weight controller's thresholds and evidence rule
    failover = FailoverPolicy()
    assert got.gates.max_5xx_increase == failover.error_rate_threshold
    assert got.gates.min_samples == failover.min_samples
    # a bake covers several of the weight controller's windows beyond what it needs to breach
    assert got.bake_ms >= 5 * failover.window_ms * failover.breach_windows


def test_every_knob_is_read() -> None:
    got = policy("""\
rollout:
  strategy: waves
  canary: [sjc, lhr]
  waves: [10%, 60, 100%]
  bake: 2m
  renewals: waves
  stats_flush_interval: 10s
  gates:
    max_5xx_increase: 1%
    max_p95_ratio: 2
    min_p95_increase: 50ms
    max_shed_increase: 0.1
    max_tier_action_onsets: 1
    ack_timeout: 30s
    min_samples: 20
    evidence_timeout: 0s
""")
    assert got == RolloutPolicy(
        strategy="waves", canary=("sjc", "lhr"), waves=(10, 60, 100), bake_ms=120_000,
        renewals="waves",
        stats_flush_interval_ms=10_000,
        gates=RolloutGates(max_5xx_increase=0.01, max_p95_ratio=2.0, min_p95_increase_ms=50,
                           max_shed_increase=0.1, max_tier_action_onsets=1,
                           ack_timeout_ms=30_000, min_samples=20, evidence_timeout_ms=0))


def test_immediate_strategy() -> None:
    assert policy("rollout: {strategy: immediate}\n").strategy == "immediate"
    # no bake, no gate: the shortest bake does not apply
    assert policy("rollout: {strategy: immediate, bake: 1s}\n").bake_ms == 1000


@pytest.mark.parametrize(("rollout", "expected"), [
    ("rollout: {canary: [fra]}\n",
     "test.yaml:16:19: rollout.canary: unknown pop 'fra'"),
    ("rollout: {canary: [ewr, ewr]}\n",
     "test.yaml:16:19: rollout.canary: lists a PoP twice: ['ewr', 'ewr']"),
    ("rollout: {canary: ewr}\n",
     "test.yaml:16:19: rollout.canary: must be a list of 1 to 100 PoP names, e.g. [fra]"),
    ("rollout: {waves: [50%, 80%]}\n",
     "test.yaml:16:18: rollout.waves: must end at 100% (the last wave reaches every PoP), "
     "got [50, 80]"),
    ("rollout: {waves: [60, 50, 100]}\n",
     "test.yaml:16:18: rollout.waves: must rise wave by wave, got [60, 50, 100]"),
    ("rollout: {waves: []}\n",
     "test.yaml:16:18: rollout.waves: must be a list of 1 to 10 percents of the PoPs after "
     "the canary, cumulative, e.g. [50%, 100%]"),
    ("rollout: {bake: 500ms}\n",
     "test.yaml:16:17: rollout.bake: must be between 1s and 24h, got 500ms"),
    ("rollout: {bake: 9s}\n",
     "test.yaml:16:17: rollout.bake: bake (9s) is below 10s, two stats flushes (Envoys flush "
     "every 5s, stats_flush_interval): the first flush after a wave's ACKs still carries "
     "traffic served on the old version, so its gate could not judge one full flush of the "
     "change's own"),
    ("rollout: {bake: 3s, stats_flush_interval: 2s}\n",
     "test.yaml:16:17: rollout.bake: bake (3s) is below 4s, two stats flushes (Envoys flush "
     "every 2s, stats_flush_interval): the first flush after a wave's ACKs still carries "
     "traffic served on the old version, so its gate could not judge one full flush of the "
     "change's own"),
    ("rollout: {strategy: canary}\n",
     "test.yaml:16:21: rollout.strategy: must be one of waves, immediate, got 'canary'"),
    ("rollout: {renewals: later}\n",
     "test.yaml:16:21: rollout.renewals: must be one of immediate, waves, got 'later'"),
    ("rollout: {gates: {max_p95_ratio: 0.5}}\n",
     "test.yaml:16:34: rollout.gates.max_p95_ratio: must be between 1 and 100, got 0.5"),
    ("rollout: {gates: {ack_timout: 30s}}\n",
     "test.yaml:16:19: rollout.gates: unknown key 'ack_timout'; did you mean 'ack_timeout'?"),
    ("rollout: {bak: 1m}\n",
     "test.yaml:16:11: rollout: unknown key 'bak'; did you mean 'bake'?"),
    ("rollout: [1]\n",
     "test.yaml:16:10: rollout: must be a mapping, got a list"),
])
def test_bad_values_name_their_line_and_path(rollout: str, expected: str) -> None:
    assert expected in problems(rollout)


def test_the_rollout_section_alone_changes_no_served_config() -> None:
    """Changing only `rollout:` gives a new version whose PoPs' resources are the same."""
    before = parse_desired(BASE.format(rollout=""), "test.yaml")
    after = parse_desired(BASE.format(rollout="rollout: {canary: [lhr], bake: 1m}\n"),
                          "test.yaml")
    assert before.digest != after.digest
    caps = release_capabilities(DEFAULT_ENVOY_RELEASE)
    for pop in before.pop_names:
        assert render_json(translate_pop(before, pop, caps)) == \
            render_json(translate_pop(after, pop, caps))
