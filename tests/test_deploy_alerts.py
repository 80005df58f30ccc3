"""deploy/prometheus: the alerting rules are valid, fire when they should (promtool's own rule
unit tests), and name only series Ballast really exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from control_plane.own_metrics.registry import BallastMetrics

RULES_DIR = Path(__file__).resolve().parents[1] / "deploy" / "prometheus"
RULES = RULES_DIR / "ballast-alerts.yaml"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.skip("promtool not installed (deploy/ensure-test-services.sh installs prometheus)")
    return subprocess.run([binary, *args], cwd=RULES_DIR, capture_output=True, text=True,
                          timeout=60)


def test_rules_are_valid_and_their_unit_tests_pass() -> None:
    checked = _promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = _promtool("test", "rules", "ballast-alerts-test.yaml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_rules_use_only_series_ballast_exports() -> None:
    metrics = BallastMetrics()
    metrics.nacks.labels("CDS").inc()
    metrics.convergence.labels("CDS").observe(0.01)
    metrics.connected_nodes.labels("ewr").set(1)
    metrics.source_staleness.labels("ewr", "shop").set(1)
    metrics.tier_action_active.labels("ewr", "shop", "shed", "background").set(0)
    metrics.config_reloads.labels("rejected").inc()
    metrics.set_certificates([("shop", "standby", 29.5, True)])
    metrics.set_served_certificates([("https", "shop", 20.0)])
    exported = {
        sample.name
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for sample in family.samples
    }
    groups = yaml.safe_load(RULES.read_text())["groups"]
    used = {
        name
        for group in groups
        for rule in group["rules"]
        for name in re.findall(r"\bballast_[a-z_]+", rule["expr"])
    }
    assert used, "the rules reference Ballast's series"
    assert used <= exported, f"not exported: {sorted(used - exported)}"
