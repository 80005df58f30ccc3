"""`tiers.<t>.hedge_delay`: off by default, a duration or `off`, checked against retries and the
read timeout; the example hedges critical requests after 50 ms (the tiers source)."""

from __future__ import annotations

from pathlib import Path

import pytest

from control_plane.desired import DesiredStateError, load_desired, parse_desired

EXAMPLE = Path(__file__).parent.parent / "examples" / "desired.yaml"

DOC = """
pops: {ewr: {}}
%s
origin_groups:
  shop:
    origins:
      primary: {address: 127.0.0.1, port: 8081}
      standby: {address: 127.0.0.1, port: 8082}
%s
listeners:
  - {name: edge, port: 10000, virtual_hosts: [{name: shop, domains: ["*"], origin_group: shop}]}
"""


REST = "normal: {}, background: {}"


def hedges(tiers: str = "", group: str = "") -> dict[str, int]:
    desired = parse_desired(DOC % (tiers, group), "d.yaml")
    return {t.name: t.hedge_delay_ms for t in desired.group("shop").tiers}


def problems_of(tiers: str = "", group: str = "") -> list[str]:
    with pytest.raises(DesiredStateError) as caught:
        parse_desired(DOC % (tiers, group), "d.yaml")
    return [str(p) for p in caught.value.problems]


def test_off_by_default_for_every_tier() -> None:
    assert hedges() == {"critical": 0, "normal": 0, "background": 0}


def test_global_and_group_layers() -> None:
    assert hedges(f"tiers: {{critical: {{hedge_delay: 50ms}}, {REST}}}") == {
        "critical": 50, "normal": 0, "background": 0}
    assert hedges(f"tiers: {{critical: {{hedge_delay: 50ms}}, {REST}}}",
                  "    tiers: {critical: {hedge_delay: 'off'}, normal: {hedge_delay: 1s}}") == {
        "critical": 0, "normal": 1000, "background": 0}


def test_the_example_hedges_critical_after_50ms() -> None:
    desired = load_desired(EXAMPLE)
    assert {t.name: t.hedge_delay_ms for t in desired.group("shop").tiers} == {
        "critical": 50, "normal": 0, "background": 0}


@pytest.mark.parametrize(("tiers", "expected"), [
    (f"tiers: {{critical: {{hedge_delay: 50}}, {REST}}}",
     "tiers.critical.hedge_delay: must be a duration"),
    (f"tiers: {{critical: {{hedge_delay: 2m}}, {REST}}}", "must be between 1ms and 1m"),
    (f"tiers: {{critical: {{hedge_delay: 2s}}, {REST}}}",
     "hedge_delay (2000 ms) of tier 'critical' must be below its read_timeout (2000 ms)"),
    ("tiers: {critical: {}, normal: {}, background: {hedge_delay: 50ms}}",
     "tier 'background' hedges (hedge_delay) but has retries: 0"),
])
def test_problems(tiers: str, expected: str) -> None:
    found = problems_of(tiers)
    assert any(expected in problem for problem in found), found
