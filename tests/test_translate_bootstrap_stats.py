"""The stats matcher of `--metrics-sink` bootstraps keeps what Ballast reads and drops the rest.

Envoy's regex matchers are full matches (measured: `^cluster\\.` alone kept no zone stat), so
the table checks whole names with `re.fullmatch`; the end-to-end tests prove it against Envoy.
"""

from __future__ import annotations

import re

import pytest

from control_plane.cli.envoy_validate import validate_bootstrap
from control_plane.cli.main import main
from control_plane.translate.bootstrap import NEEDED_STATS, ads_bootstrap


def kept(name: str) -> bool:
    return any(re.fullmatch(pattern, name) for pattern in NEEDED_STATS)


@pytest.mark.parametrize(
    ("name", "keep"),
    [
        ("cluster.shop.critical.zone.ewr.primary.upstream_rq_2xx", True),
        ("cluster.shop.critical.zone.ewr.primary.upstream_rq_time", True),
        ("cluster.shop.critical.upstream_rq_pending_active", True),
        ("cluster.shop.critical.upstream_rq_pending_overflow", True),
        ("cluster.shop.normal.upstream_rq_5xx", True),
        ("control_plane.connected_state", True),
        ("http.edge.downstream_rq_2xx", True),
        ("server.live", True),
        ("cluster.shop.critical.lb_zone_routing_all_directly", False),
        ("cluster.shop.critical.upstream_rq_pending_active_x", False),
        ("cluster.ballast_xds.upstream_rq_total", False),
        ("listener.0.0.0.0_10000.downstream_cx_total", False),
    ],
)
def test_needed_stats_table(name: str, keep: bool) -> None:
    assert kept(name) is keep


def test_metrics_sink_bootstrap_carries_the_matcher_unless_all_stats(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["bootstrap", "--pop", "ewr", "--node-id", "n1", "--format", "json", "--metrics-sink"]
    assert main(base) == 0
    assert '"stats_matcher"' in capsys.readouterr().out
    assert main([*base, "--all-stats"]) == 0
    assert '"stats_matcher"' not in capsys.readouterr().out


@pytest.mark.envoy
def test_envoy_accepts_the_matcher() -> None:
    ok, output = validate_bootstrap(
        ads_bootstrap(node_id="n1", pop="ewr", metrics_sink=True, needed_stats_only=True)
    )
    assert ok, output
