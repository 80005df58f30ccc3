"""`classification.trusted_priority_sources`: the networks whose `x-ballast-tier` is believed."""

from __future__ import annotations

import pytest

from control_plane.desired import DesiredStateError, parse_desired


def problems_of(text: str) -> list[str]:
    with pytest.raises(DesiredStateError) as caught:
        parse_desired(text, "d.yaml")
    return [str(p) for p in caught.value.problems]


TRUST = """
pops: {ewr: {}}
origin_groups:
  shop:
    origins:
      primary: {address: 127.0.0.1, port: 8081}
classification:
  trusted_priority_sources: %s
listeners:
  - {name: edge, port: 10000, virtual_hosts: [{name: shop, domains: ["*"], origin_group: shop}]}
"""


def test_trusted_priority_sources() -> None:
    desired = parse_desired(TRUST % "[10.1.0.0/16, 127.0.0.2, '::1']", "d.yaml")
    assert desired.trusted_priority_sources == ("10.1.0.0/16", "127.0.0.2/32", "::1/128")
    plain = parse_desired(TRUST.replace("  trusted_priority_sources: %s\n", "  rules: []\n"),
                          "d.yaml")
    assert plain.trusted_priority_sources == ()


@pytest.mark.parametrize(("value", "expected"), [
    ("[10.1.0.1/16]", "classification.trusted_priority_sources[0]: must be an IP network"),
    ("[nope]", "classification.trusted_priority_sources[0]: must be an IP network"),
    ("[10.0.0.0/8, 10.0.0.0/8]", "classification.trusted_priority_sources[1]: 10.0.0.0/8 is "
     "listed twice"),
    ("10.0.0.0/8", "classification.trusted_priority_sources: must be a list"),
])
def test_trusted_priority_source_problems(value: str, expected: str) -> None:
    found = problems_of(TRUST % value)
    assert any(expected in problem for problem in found), found
