"""`ballast prometheus-config`: a configuration promtool accepts, every edge labelled with its PoP,
the replicas over HTTPS with the token, and the shipped alert rules wired in (issue 25)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from control_plane.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def test_scrape_configuration_and_rules(tmp_path: Path, capsys) -> None:
    token, ca = tmp_path / "admin.token", tmp_path / "ca.pem"
    token.write_text("a-token-long-enough-to-use\n")
    ca.write_text("")
    out = tmp_path / "prometheus"
    assert main(["prometheus-config", str(out), "--edge", "ewr=198.18.0.5:9902",
                 "--edge", "sjc=198.18.0.6:9902", "--edge", "ewr=198.18.0.7:9902",
                 "--ballast", "198.18.0.1:18001", "--ballast", "198.18.0.2:18001",
                 "--ca", str(ca), "--token-file", str(token)]) == 0
    config = yaml.safe_load((out / "prometheus.yml").read_text())
    envoy, ballast = config["scrape_configs"]
    assert envoy["metrics_path"] == "/stats/prometheus" and envoy["honor_labels"] is True
    assert envoy["static_configs"] == [
        {"targets": ["198.18.0.5:9902", "198.18.0.7:9902"], "labels": {"ballast_pop": "ewr"}},
        {"targets": ["198.18.0.6:9902"], "labels": {"ballast_pop": "sjc"}}]
    assert ballast["scheme"] == "https"
    assert ballast["authorization"]["credentials_file"] == str(token)
    assert ballast["tls_config"] == {"ca_file": str(ca)}
    assert config["rule_files"] == [str(out / "ballast-alerts.yaml")]
    assert (out / "ballast-alerts.yaml").read_text() == \
        (ROOT / "deploy/prometheus/ballast-alerts.yaml").read_text()
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    checked = subprocess.run([promtool, "check", "config", str(out / "prometheus.yml")],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 1 rule files found" in checked.stdout + checked.stderr


def test_bad_targets_are_refused(tmp_path: Path, capsys) -> None:
    for bad in (["--edge", "198.18.0.5:9902"], ["--edge", "e wr=1.2.3.4:1"],
                ["--ballast", "nohost"], ["--edge", "ewr=1.2.3.4:99999"]):
        with pytest.raises(SystemExit):
            main(["prometheus-config", str(tmp_path), *bad])
    assert main(["prometheus-config", str(tmp_path)]) == 2
    assert not (tmp_path / "prometheus.yml").exists()
