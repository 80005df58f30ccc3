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


def promtool_check(config: Path) -> str:
    """promtool's verdict on `config` (it must pass), or the test skipped without promtool."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    checked = subprocess.run([promtool, "check", "config", str(config)],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    return checked.stdout + checked.stderr


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
    assert "SUCCESS: 1 rule files found" in promtool_check(out / "prometheus.yml")


def test_bad_targets_are_refused(tmp_path: Path, capsys) -> None:
    for bad in (["--edge", "198.18.0.5:9902"], ["--edge", "e wr=1.2.3.4:1"],
                ["--ballast", "nohost"], ["--edge", "ewr=1.2.3.4:99999"]):
        with pytest.raises(SystemExit):
            main(["prometheus-config", str(tmp_path), *bad])
    assert main(["prometheus-config", str(tmp_path)]) == 2
    assert not (tmp_path / "prometheus.yml").exists()


def test_alerting_absolute_paths_and_no_overwrite_without_force(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Issue 37: the alerts go to the Alertmanager given; `--ca`/`--token-file` given relative
    are written absolute (Prometheus would resolve them from the configuration's directory); a
    file that differs is not replaced without --force, and nothing at all is written then."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ballast").mkdir()
    (tmp_path / "ballast/ca.pem").write_text("")
    (tmp_path / "ballast/admin.token").write_text("a-token-long-enough-to-use\n")
    out = tmp_path / "prometheus"
    args = ["prometheus-config", str(out), "--edge", "ewr=198.18.0.5:9902",
            "--ballast", "198.18.0.1:18001", "--ca", "ballast/ca.pem",
            "--token-file", "ballast/admin.token", "--alertmanager", "198.18.0.9:9093"]
    assert main(args) == 0
    config = yaml.safe_load((out / "prometheus.yml").read_text())
    assert config["alerting"] == {
        "alertmanagers": [{"static_configs": [{"targets": ["198.18.0.9:9093"]}]}]}
    ballast = config["scrape_configs"][1]
    assert ballast["tls_config"] == {"ca_file": str(tmp_path / "ballast/ca.pem")}
    assert ballast["authorization"]["credentials_file"] == str(tmp_path / "ballast/admin.token")
    first = (out / "prometheus.yml").read_bytes()
    capsys.readouterr()
    assert main(args) == 0  # the same again: nothing to replace
    assert "unchanged" in capsys.readouterr().out

    # another edge: refused without --force, and neither file is touched
    (out / "ballast-alerts.yaml").write_text("# the operator's own rules\n")
    more = [*args, "--edge", "sjc=198.18.0.6:9902"]
    assert main(more) == 1
    err = capsys.readouterr().err
    assert f"{out / 'prometheus.yml'} exists and differs" in err
    assert f"{out / 'ballast-alerts.yaml'} exists and differs" in err
    assert "--force" in err
    assert (out / "prometheus.yml").read_bytes() == first
    assert (out / "ballast-alerts.yaml").read_text() == "# the operator's own rules\n"
    assert main([*more, "--force"]) == 0
    config = yaml.safe_load((out / "prometheus.yml").read_text())
    assert [c["labels"]["ballast_pop"] for c in config["scrape_configs"][0]["static_configs"]] \
        == ["ewr", "sjc"]
    assert (out / "ballast-alerts.yaml").read_text() == \
        (ROOT / "deploy/prometheus/ballast-alerts.yaml").read_text()
    promtool_check(out / "prometheus.yml")


def test_without_an_alertmanager_it_says_the_alerts_notify_nobody(tmp_path: Path,
                                                                  capsys) -> None:
    assert main(["prometheus-config", str(tmp_path), "--edge", "ewr=198.18.0.5:9902"]) == 0
    assert "notify nobody" in capsys.readouterr().err
    assert "alerting" not in yaml.safe_load((tmp_path / "prometheus.yml").read_text())
