"""Issues 25 and 37: deploy/README.md's runbook walked on seven hosts, from a wheel built from the
repository to a verified fleet behind its firewall, through a partition of the leader's host,
then an upgrade (a release that never gets ready rolled back first), an edge's Envoy upgrade,
certificate, etcd certificate and admin token rotation, etcd snapshots and a restore from one,
a lost etcd member replaced and a new edge added.

The hosts are network namespaces on a bridge this test makes (`tests/support/netns.py`,
addresses from 198.18.0.0/15): `ballast-a/b/c` (a replica and an etcd member each, etcd with
TLS and client-certificate authentication), `prometheus`, `edge-ewr` and `edge-sjc` (one Envoy
each, mTLS to the replicas, the stats listener for Prometheus), `edge-ewr-2` (the edge added
at the end) and `origins` (the demo origins and the clients sending traffic through the edges).
Each host's firewall is the runbook's nftables rules, loaded in its own namespace.

Every fenced block of the runbook marked `runbook=` runs as written on the hosts it names (in
the runbook's order, but for the lost etcd member, replaced before the restore from a snapshot),
with the site block replaced by this test's addresses
(`tests/support/runbook.py`), in the host's own folder: nothing of the repository is on the
hosts' paths. The `build` block runs on the "workstation" (outside the namespaces) in a copy of
the package's sources, as a checkout; every host gets only the wheel it built, and the units,
the example desired state and the snapshot script come from what `ballast init` wrote. The
install block runs ONCE: the hosts share that virtualenv (their `/opt/ballast`; installing it
seven times would add minutes and test nothing more), so an upgrade of one host's
`/opt/ballast` is everyone's files, though only the restarted processes run them. Paths a
host owns are moved under its own folder. What the shared machine cannot do for real is played
by `tests/support/host_shims.py`: systemd (the same unit files, run as their User=; a timer's
schedule is not walked), `scp` and `ssh` (copies between the hosts' folders and commands in a
host's namespace, refused unless the runbook authorized the calling host's key), `useradd`
and `apt-get` (the accounts `ballast` and `envoy` are `nobody` here; etcd, Prometheus and
nftables are Debian's packages, already installed). Not walked, because they talk to systemd
itself: the blocks marked `needs=systemd` (time sync, the journal).

What it shows: traffic through both edges; a fault on ewr's primary shifts ewr only; the
leader's host taken off the bridge mid-shift → another replica leads within the lease, the
shift goes on and every Envoy applies the leader's weights; the link back → the old leader
follows. The firewall allows what the runbook's table says and nothing else. The upgrade goes
in the order `ballast status` gives, the leader last; a release that never gets ready fails
the readiness wait (non-zero) and is rolled back. Rotated certificates reach Envoy without a
restart; etcd serves its new certificate; the new admin token works everywhere. A snapshot
restores etcd's intent exactly. And: the admin API refuses a non-loopback address without
TLS, and etcd refuses Ballast without credentials.

Root and `ip netns` needed; several minutes here, so it runs as `make e2e-hosts`
(BALLAST_E2E_HOSTS=1), not in `make test`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from harness.fleet import fast_desired
from tests.support.host_shims import alive, stop_pid
from tests.support.netns import Host, HostNetwork
from tests.support.replicas import until
from tests.support.runbook import ROOT, RUNBOOK, Block, blocks, relocate

pytestmark = [
    pytest.mark.envoy, pytest.mark.etcd, pytest.mark.prometheus,
    pytest.mark.skipif(os.environ.get("BALLAST_E2E_HOSTS") != "1",
                       reason="the multi-host test runs with `make e2e-hosts`"),
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root"),
    pytest.mark.skipif(any(shutil.which(b) is None for b in
                           ("etcd", "etcdctl", "prometheus", "promtool", "curl", "setpriv",
                            "nft", "openssl", "ssh-keygen")),
                       reason="etcd, etcdctl, prometheus, promtool, curl, setpriv, nft, openssl "
                       "and ssh-keygen needed"),
    pytest.mark.timeout(1500),
]

ADDRESSES = {"ballast-a": "198.18.0.1", "ballast-b": "198.18.0.2", "ballast-c": "198.18.0.3",
             "prometheus": "198.18.0.10", "edge-ewr": "198.18.0.21",
             "edge-sjc": "198.18.0.22", "edge-ewr-2": "198.18.0.23", "origins": "198.18.0.30"}
CONTROL = ("ballast-a", "ballast-b", "ballast-c")
EDGES = {"edge-ewr": ("ewr", "ewr-edge-1"), "edge-sjc": ("sjc", "sjc-edge-1")}
NEW_EDGE = ("edge-ewr-2", "ewr", "ewr-edge-2")
# the hosts the runbook's `all` means (the added edge joins at the end; origins is not a host
# of the runbook's)
RUNBOOK_HOSTS = (*CONTROL, "prometheus", *EDGES)
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
NEW_VERSION = f"{VERSION}.post1"
BROKEN_VERSION = f"{VERSION}.post2"
READY_WAIT_S = 45  # a replica here gets ready in a few seconds; the broken one costs this
BACKUP_DIR = "/var/backups/ballast-etcd"
SITE = {
    "BALLAST_A": ADDRESSES["ballast-a"], "BALLAST_B": ADDRESSES["ballast-b"],
    "BALLAST_C": ADDRESSES["ballast-c"],
    "REPLICAS": " ".join(ADDRESSES[h] for h in CONTROL),
    "PROMETHEUS": ADDRESSES["prometheus"],
    "EDGE_EWR": ADDRESSES["edge-ewr"], "EDGE_SJC": ADDRESSES["edge-sjc"],
    "EDGES": " ".join(ADDRESSES[h] for h in EDGES),
    "OPERATORS": "198.18.1.0/24",  # nobody: this test's own checks run on the hosts
    "EDGE_PORTS": "10000",
    "ALERTMANAGER": "198.18.0.40:9093",  # none runs: Prometheus lists it, sends to nobody
    "BACKUP": f"prometheus:{BACKUP_DIR}",
    "VERSION": VERSION,
    "SCRAPE_INTERVAL": "1s",  # the desired state (DESIRED) decides over 3 s windows
    "READY_WAIT": str(READY_WAIT_S),
    "DRAIN_WAIT": "3",  # the clients here keep sending through the edge: no drain ends early
}
# nearest first: ewr prefers ballast-a, sjc ballast-b
XDS_ORDER = {"edge-ewr": ("ballast-a", "ballast-b", "ballast-c"),
             "edge-sjc": ("ballast-b", "ballast-c", "ballast-a"),
             "edge-ewr-2": ("ballast-a", "ballast-b", "ballast-c")}
LEASE_S = 5  # the unit's --leader-ttl
ETCD_ELECTION_S = 2  # etcd's default election timeout (1 s) and its campaign
LISTENER = 10000
DESIRED = fast_desired(listener=LISTENER, primary=8081, secondary=8082, sjc_offset=0,
                       listen_address="0.0.0.0", origin_address=ADDRESSES["origins"])
SHIMS = ("systemctl", "scp", "ssh", "useradd", "apt-get", "chown", "install")
DEBIAN_PROMETHEUS_YML = "# the example Debian's prometheus package installs\nglobal: {}\n"


class Deployment:
    """The hosts, their folders, and running the runbook's blocks on them."""

    def __init__(self, net: HostNetwork, top: Path) -> None:
        self.net = net
        self.top = top
        self.roots = top / "hosts"
        self.venv = top / "venv"
        self.bin = top / "bin"
        self.ran: list[tuple[str, str, float]] = []  # (step, host, seconds)
        self.extra: dict[str, str] = {}  # variables every block gets from here on

    def host(self, name: str) -> Host:
        return self.net.hosts[name]

    def env(self, name: str, **extra: str) -> dict[str, str]:
        env = {"PATH": f"{self.bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": str(self.roots / name / "root"), "LANG": "C.UTF-8",
               "BALLAST_E2E_PYTHON": sys.executable, "BALLAST_E2E_BIN": str(self.bin),
               "BALLAST_E2E_ROOTS": str(self.roots), "BALLAST_E2E_HOST": name,
               "BALLAST_E2E_VENV": str(self.venv),
               "BALLAST_E2E_NETNS": self.host("ballast-a").ns.removesuffix("ballast-a"),
               "HOST": name,
               # inside the namespaces there is no package index: the wheels only
               "PIP_NO_INDEX": "1",
               **SITE, **self.extra, **extra}
        if name in self.net.hosts:
            env["ADDR"] = self.host(name).address
        if name in XDS_ORDER:
            env["POP"], env["NODE"] = EDGES.get(name, NEW_EDGE[1:])
            env["XDS"] = " ".join(ADDRESSES[h] for h in XDS_ORDER[name])
        return env

    def path(self, name: str, path: str) -> Path:
        return self.roots / name / path.lstrip("/")

    def run_block(self, block: Block, name: str, *, fails: bool = False,
                  **extra: str) -> subprocess.CompletedProcess[str]:
        """`block` on host `name`, in its root's folder; it must succeed (or fail, `fails`)."""
        text = relocate(block.text, self.roots, name, self.venv)
        started = time.monotonic()
        try:
            done = self.host(name).run(["bash", "-euo", "pipefail", "-c", text],
                                       env=self.env(name, **extra), timeout=240,
                                       cwd=str(self.path(name, "/root")))
        except subprocess.TimeoutExpired as err:
            raise AssertionError(f"runbook step {block.step} on {name} timed out: "
                                 f"{str(err.stderr)[-2000:]}\n{self.logs()}") from None
        self.ran.append((block.step, name, time.monotonic() - started))
        assert (done.returncode != 0) == fails, (
            f"runbook step {block.step} on {name} "
            f"{'succeeded' if fails else 'failed'} ({done.returncode}):\n{text}\n"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}\n"
            f"{self.logs()}")
        return done

    def logs(self, lines: int = 15) -> str:
        """The tail of every service's log, for a failure's message."""
        out = []
        for log in sorted(self.roots.glob("*/log/*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.relative_to(self.roots)}\n" + "\n".join(tail))
        return "\n".join(out)

    def run_step(self, step: str, runbook: list[Block], hosts: tuple[str, ...] | None = None,
                 **extra: str) -> dict[str, str]:
        """Every block of `step` on its hosts (`all`: the runbook's hosts), or on `hosts` only
        (those of them the blocks name)."""
        outputs = {}
        for block in (b for b in runbook if b.step == step):
            names = RUNBOOK_HOSTS if block.hosts == ("all",) else block.hosts
            for name in names:
                if hosts is None or name in hosts:
                    outputs[name] = self.run_block(block, name, **extra).stdout
        return outputs

    def block(self, step: str, runbook: list[Block], host: str) -> Block:
        (found,) = [b for b in runbook if b.step == step
                    and (host in b.hosts or b.hosts == ("all",))]
        return found

    def run_outside(self, block: Block, name: str, cwd: Path, **extra: str) -> str:
        """A block outside the namespaces (the workstation's; the one install), which needs
        the package index."""
        env = {**self.env(name, **extra), "PIP_FIND_LINKS": "/opt/wheels"}
        del env["PIP_NO_INDEX"]
        text = relocate(block.text, self.roots, name, self.venv)
        started = time.monotonic()
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", text], env=env, cwd=cwd,
                              capture_output=True, text=True, timeout=600)
        self.ran.append((block.step, name, time.monotonic() - started))
        assert done.returncode == 0, f"{block.step} on {name}:\n{done.stderr[-3000:]}"
        return done.stdout

    def curl(self, name: str, url: str, *extra: str) -> tuple[int, str]:
        done = self.host(name).run(["curl", "-s", "--max-time", "3", "-w", "\n%{http_code}",
                                    *extra, url], timeout=10)
        body, _, code = done.stdout.rpartition("\n")
        return int(code or 0), body

    def admin(self, name: str, path: str) -> dict[str, Any]:
        """A replica's admin API over HTTPS with the token, asked from its own host."""
        tls = self.path(name, "/etc/ballast/tls")
        token = (tls / "admin.token").read_text().strip()
        code, body = self.curl(name, f"https://{ADDRESSES[name]}:18001{path}",
                               "--cacert", str(tls / "ca.pem"),
                               "-H", f"Authorization: Bearer {token}")
        return json.loads(body) if code == 200 else {}

    def leading(self, name: str) -> bool:
        return bool(self.admin(name, "/status").get("replication", {}).get("leading"))

    def leader(self, among: tuple[str, ...] = CONTROL) -> str | None:
        leaders = [name for name in among if self.leading(name)]
        return leaders[0] if len(leaders) == 1 else None

    def weights(self, name: str, pop: str) -> dict[str, int]:
        return self.admin(name, "/weights").get("weights", {}).get(pop, {}).get("shop", {})

    def envoy_weights(self, edge: str) -> dict[str, int]:
        code, body = self.curl(edge, "http://127.0.0.1:9901/config_dump?include_eds")
        if code != 200:
            return {}
        for config in json.loads(body)["configs"]:
            for entry in config.get("dynamic_endpoint_configs", []):
                assignment = entry["endpoint_config"]
                if assignment["cluster_name"] == "shop.critical":
                    return {e["locality"]["zone"]: e.get("load_balancing_weight", 1)
                            for e in assignment.get("endpoints", [])}
        return {}

    def envoy_pid(self, edge: str) -> int:
        return int(self.path(edge, "/run/envoy.pid").read_text())

    def etcdctl(self, *args: str) -> str:
        """etcdctl as etcd's root on ballast-a (the runbook's /root/etcdctl.env)."""
        tls = self.path("ballast-a", "/etc/etcd/tls")
        done = self.host("ballast-a").run(
            ["etcdctl", *args],
            env={"ETCDCTL_API": "3", "ETCDCTL_ENDPOINTS": "https://127.0.0.1:2379",
                 "ETCDCTL_CACERT": str(tls / "ca.pem"), "ETCDCTL_CERT": str(tls / "root.pem"),
                 "ETCDCTL_KEY": str(tls / "root.key"), "PATH": "/usr/bin:/bin"})
        assert done.returncode == 0, done.stderr
        return done.stdout

    def fault(self, body: str) -> None:
        code, _ = self.curl("origins", f"http://{ADDRESSES['origins']}:8081/_ballast/fault",
                            "-XPOST", "-d", body)
        assert code == 200

    def stop_everything(self) -> None:
        for every in self.roots.glob("*/run/all"):
            for pid in {int(p) for p in every.read_text().split()}:
                if alive(pid):
                    stop_pid(pid, timeout=5)


@pytest.fixture
def deployment() -> Iterator[Deployment]:
    top = Path(tempfile.mkdtemp(prefix=f"ballast-hosts-{os.getpid()}-"))
    top.chmod(0o755)  # the services run as nobody, etcd, prometheus: they traverse it
    with HostNetwork(ADDRESSES) as net:
        deployed = Deployment(net, top)
        try:
            yield deployed
        finally:
            deployed.stop_everything()
            for name, seconds in ((f"{s}@{h}", t) for s, h, t in deployed.ran):
                print(f"runbook {name}: {seconds:.1f} s")
    if os.environ.get("BALLAST_E2E_KEEP") != "1":
        shutil.rmtree(top, ignore_errors=True)


def _prepare(d: Deployment) -> None:
    d.bin.mkdir()
    for shim in SHIMS:
        path = d.bin / shim
        # the checkout on PYTHONPATH for the shim only: the runbook's own commands must see
        # nothing of it (pip would take its egg-info for an installed ballast-xds)
        path.write_text(f'#!/bin/sh\nPYTHONPATH={ROOT} exec "$BALLAST_E2E_PYTHON" -m '
                        f'tests.support.host_shims {shim} "$@"\n')
        path.chmod(0o755)
    for name in (*ADDRESSES, "workstation"):
        (d.roots / name / "root").mkdir(parents=True)
        d.path(name, "/root").chmod(0o700)
        for folder in ("/etc", "/var/lib", "/var/backups", "/etc/systemd/system",
                       "/etc/default"):
            d.path(name, folder).mkdir(parents=True, exist_ok=True)
        d.path(name, "/etc/hosts").write_text("127.0.0.1 localhost\n")
        d.roots.joinpath(name).chmod(0o755)
    # what Debian's prometheus package leaves, and the backup host's directory
    d.path("prometheus", "/etc/prometheus").mkdir()
    d.path("prometheus", "/etc/prometheus/prometheus.yml").write_text(DEBIAN_PROMETHEUS_YML)
    d.path("prometheus", BACKUP_DIR).mkdir(parents=True)


def _checkout(d: Deployment, version: str, *, broken: bool = False) -> Path:
    """A copy of the package's sources as a checkout of release `version` (`broken`: one whose
    `ballast serve` exits at start, a release that never gets ready)."""
    checkout = d.top / f"checkout-{version}"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "control_plane", checkout / "control_plane", ignore=ignore)
    project = (ROOT / "pyproject.toml").read_text()
    (checkout / "pyproject.toml").write_text(
        project.replace(f'version = "{VERSION}"', f'version = "{version}"', 1))
    if broken:
        serve = checkout / "control_plane/cli/serve.py"
        serve.write_text(serve.read_text().replace(
            "def run(args: argparse.Namespace) -> int:\n",
            "def run(args: argparse.Namespace) -> int:\n"
            "    raise SystemExit('ballast serve: a release that never gets ready')\n", 1))
    return checkout


def _release(d: Deployment, runbook: list[Block], version: str, *, broken: bool = False) -> None:
    """Step 1's build and wheel blocks for `version`: its wheel on every host."""
    d.run_outside(d.block("build", runbook, "workstation"), "workstation",
                  _checkout(d, version, broken=broken), VERSION=version)
    d.run_step("wheel", runbook, VERSION=version)
    wheel = f"/root/ballast_xds-{version}-py3-none-any.whl"
    assert all(d.path(h, wheel).exists() for h in RUNBOOK_HOSTS)


def _installed_version(d: Deployment) -> str:
    # -I: not the repository's egg-info beside the test's working directory
    done = subprocess.run([str(d.venv / "bin/python"), "-I", "-c",
                           "import importlib.metadata as m; print(m.version('ballast-xds'))"],
                          capture_output=True, text=True, timeout=60, check=True, cwd=d.top)
    return done.stdout.strip()


def _refusals(d: Deployment) -> None:
    """A replica's admin API off loopback without TLS, and Ballast without etcd credentials:
    both refused at start, with the reason."""
    ballast = str(d.venv / "bin" / "ballast")
    desired = str(d.path("ballast-b", "/etc/ballast/desired.yaml"))
    tls = d.path("ballast-b", "/etc/ballast/tls")
    state = d.top / "refused-state"
    b = ADDRESSES["ballast-b"]
    plain = d.host("ballast-b").run(
        [ballast, "serve", desired, "--state-dir", str(state), "--no-probes",
         "--xds-address", f"{b}:18100", "--admin-address", f"{b}:18101",
         "--tls-cert", str(tls / "server.pem"), "--tls-key", str(tls / "server.key"),
         "--client-ca", str(tls / "ca.pem"), "--admin-token-file", str(tls / "admin.token")],
        timeout=60)
    assert plain.returncode != 0
    assert f"refusing to serve the admin API on {b} over plain HTTP" in plain.stderr
    store = f"etcd://{b}:2379"
    for creds in ([], ["--store-ca", str(tls / "etcd/ca.pem")]):
        refused = d.host("ballast-b").run(
            [ballast, "serve", desired, "--state-dir", str(state), "--no-probes",
             "--xds-address", "127.0.0.1:18100", "--admin-address", "127.0.0.1:18101",
             "--store", store, "--metrics-source", "prometheus",
             "--prometheus-url", f"http://{ADDRESSES['prometheus']}:9090", *creds],
            timeout=60)
        assert refused.returncode == 1, refused.stderr
        assert "ballast serve: etcd unavailable" in refused.stderr, refused.stderr


def _connected(d: Deployment) -> set[str]:
    """The node ids connected to any replica."""
    return {n["node_id"] for r in CONTROL for n in d.admin(r, "/nodes").get("nodes", [])}


def _statuses(path: Path, since: float) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {"ewr": [], "sjc": []}
    for line in path.read_text().splitlines():
        at, pop, status = line.split()
        if float(at) >= since:
            out[pop].append(int(status))
    return out


async def test_the_runbook_on_hosts(deployment: Deployment) -> None:
    d = deployment
    runbook = blocks()
    steps = [b.step for b in runbook]
    assert steps[0] == "site" and "install" in steps
    # every command block of deploy/README.md is a runbook block: none escapes this walk
    fences = [line for line in RUNBOOK.read_text().splitlines()
              if line.startswith("```") and line != "```"]
    assert len(fences) == len(runbook), [f for f in fences if "runbook=" not in f]
    # nothing of the repository on the hosts: every path a block names is the host's own or
    # what the wheel installed
    assert not [b.step for b in runbook if re.search(r"(?<![\w/])(deploy|examples)/", b.text)]
    not_walked = sorted({b.step for b in runbook if b.needs is not None})
    print(f"not walked (needs systemd): {', '.join(not_walked)}")
    started = time.monotonic()
    _prepare(d)
    await _site_and_install(d, runbook)
    install_s = time.monotonic() - started
    for step in ("users", "firewall", "certs", "distribute", "permissions", "etcd-cert",
                 "node-cert", "etcd", "etcd-health", "etcd-auth"):
        d.run_step(step, runbook)
    # the site's desired state (its version control: a folder on ballast-a), to all three
    d.path("ballast-a", "/root/site").mkdir()
    d.path("ballast-a", "/root/site/desired.yaml").write_text(DESIRED)
    d.run_step("desired", runbook)
    assert all(d.path(h, "/etc/ballast/desired.yaml").read_text() == DESIRED for h in CONTROL)
    # the origins and the clients (the runbook's business ends at the edges)
    traffic = d.top / "traffic.log"
    origins = subprocess.Popen(
        d.host("origins").argv(
            [sys.executable, "-m", "tests.support.hosts_origins", ADDRESSES["origins"],
             str(traffic), *[f"--edge={pop}=http://{ADDRESSES[e]}:{LISTENER}"
                             for e, (pop, _) in EDGES.items()]]),
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=open(d.top / "origins.log", "ab"))  # noqa: SIM115
    try:
        await _deployed_fleet(d, runbook, traffic)
        await _upgrade(d, runbook)
        await _rotations(d, runbook, traffic)
        await _etcd_member_replaced(d, runbook)
        await _backup_and_restore(d, runbook)
        await _new_edge(d, runbook)
    finally:
        stop_pid(origins.pid, timeout=5)
        origins.wait()
    # every runbook block ran but those that need systemd (the install block once, for the
    # shared virtualenv)
    ran = {step for step, _, _ in d.ran} | {"site"}
    assert ran == {b.step for b in runbook} - set(not_walked), \
        {b.step for b in runbook} - set(not_walked) - ran
    print(f"site and install {install_s:.0f} s, whole walk {time.monotonic() - started:.0f} s")


async def _site_and_install(d: Deployment, runbook: list[Block]) -> None:
    """Step 0 (names, SSH) and step 1: the wheel built on the workstation from a checkout,
    copied to every host, installed with the kit `ballast init` writes."""
    d.run_step("names", runbook)
    for name in RUNBOOK_HOSTS:
        hosts = d.path(name, "/etc/hosts").read_text()
        assert "127.0.0.1 localhost" in hosts
        for host in RUNBOOK_HOSTS:
            assert f"{ADDRESSES[host]} {host}  # ballast site" in hosts
    (key,) = d.run_step("ssh-key", runbook).values()
    assert key.startswith("ssh-ed25519 ") and key.strip().endswith("deploy@ballast-a")
    d.extra["DEPLOY_KEY"] = key.strip()
    d.run_step("ssh-authorize", runbook)
    _release(d, runbook, VERSION)
    (install,) = [b for b in runbook if b.step == "install"]
    assert install.hosts == ("all",)
    d.run_outside(install, "ballast-a", d.top)
    assert _installed_version(d) == VERSION
    kit = d.venv / "kit"
    assert (kit / "ballast-replica.service").exists() and (kit / "desired.yaml").exists()


async def _deployed_fleet(d: Deployment, runbook: list[Block], traffic: Path) -> None:
    for step in ("replica", "prometheus", "envoy"):
        d.run_step(step, runbook)
    # Debian's example kept aside, not overwritten
    assert d.path("prometheus", "/etc/prometheus/prometheus.yml.debian").read_text() == \
        DEBIAN_PROMETHEUS_YML
    await until(lambda: all(d.admin(n, "/readyz").get("ready") for n in CONTROL), 60,
                "three replicas ready")
    await until(lambda: d.leader() is not None, 30, "a leader")
    await until(lambda: _connected(d) >= {"ewr-edge-1", "sjc-edge-1"}, 60,
                "both Envoys connected")
    (status,) = d.run_step("verify", runbook).values()
    assert "LEADER term" in status and "ewr-edge-1" in status and "sjc-edge-1" in status, status
    _refusals(d)

    # Prometheus scrapes every edge's stats listener and every replica's HTTPS /metrics,
    # and sends its alerts to the Alertmanager given
    await until(lambda: _targets_up(d, 5), 60, "Prometheus: two edges and three replicas up")
    code, body = d.curl("prometheus", f"http://{ADDRESSES['prometheus']}:9090"
                        "/api/v1/alertmanagers")
    assert code == 200 and f"{SITE['ALERTMANAGER']}" in body, body
    code, _ = d.curl("prometheus", f"http://{ADDRESSES['edge-ewr']}:9902/config_dump")
    assert code == 404  # the stats listener serves nothing else of the admin
    code, _ = d.curl("prometheus", f"http://{ADDRESSES['edge-ewr']}:9901/ready")
    assert code == 0  # and the admin is not reachable from another host
    # the firewall, from the other side: what the table allows, nothing else
    d.run_step("firewall-check", runbook)
    code, _ = d.curl("origins", f"https://{ADDRESSES['ballast-a']}:18001/healthz", "-k")
    assert code == 0  # a client's host reaches no replica's admin API
    code, _ = d.curl("origins", f"http://{ADDRESSES['edge-ewr']}:{LISTENER}/")
    assert code != 0  # and every edge's listener
    await _partition(d, traffic)


def _targets_up(d: Deployment, count: int) -> bool:
    code, body = d.curl("prometheus", f"http://{ADDRESSES['prometheus']}:9090/api/v1/targets")
    active = json.loads(body)["data"]["activeTargets"] if code == 200 else []
    return len(active) == count and all(t["health"] == "up" for t in active)


async def _partition(d: Deployment, traffic: Path) -> None:
    # traffic through both edges
    since = time.time()
    await until(lambda: all(s.count(200) >= 20 for s in _statuses(traffic, since).values()),
                60, "traffic through both edges")
    initial = {pop: d.weights("ballast-a", pop) for pop in ("ewr", "sjc")}
    assert initial["ewr"] == initial["sjc"] and initial["ewr"]["primary"] >= 90, initial

    # a fault on ewr's primary shifts ewr only
    d.fault('{"error_rate": 0.6, "pops": ["ewr"]}')
    leader = d.leader()
    assert leader is not None
    await until(lambda: 50 <= d.weights(leader, "ewr").get("primary", 100) <= 80, 90,
                "ewr in the middle of its shift")
    assert d.weights(leader, "sjc") == initial["sjc"]

    # the leader's host off the bridge
    others = tuple(n for n in CONTROL if n != leader)
    old_term = d.admin(leader, "/status")["replication"]["term"]
    at_partition = d.weights(leader, "ewr")["primary"]
    d.net.link(leader, up=False)
    cut = time.monotonic()
    took = await until(lambda: d.leader(others) is not None, LEASE_S + 15, "a new leader")
    new = d.leader(others)
    assert new is not None
    assert d.admin(new, "/status")["replication"]["term"] > old_term
    # the lease (etcd renews every lease when its raft leader changes: when the partitioned
    # host also led etcd, its election comes first), one tick, a loaded machine's slack
    assert took <= LEASE_S + ETCD_ELECTION_S + 1 + 4, took
    await until(lambda: d.weights(new, "ewr").get("primary", 100) < at_partition, 30,
                "the shift going on under the new leader")

    # every Envoy applies what the new leader serves (ewr's Envoy left its preferred replica)
    def envoys_agree() -> bool:
        return all(d.envoy_weights(edge) == d.weights(new, pop)
                   for edge, (pop, _) in EDGES.items())

    await until(envoys_agree, 30, "every Envoy on the new leader's weights")
    (third,) = (n for n in others if n != new)
    await until(lambda: d.weights(third, "ewr") == d.weights(new, "ewr"), 10,
                "the other follower serving the leader's weights")
    assert d.weights(new, "sjc") == initial["sjc"]
    during = _statuses(traffic, since)
    assert during["sjc"].count(200) == len(during["sjc"]), "sjc lost requests"

    # the link back: the old leader follows
    d.net.link(leader, up=True)
    await until(lambda: d.admin(leader, "/status").get("replication", {}).get("store_reachable")
                is True and not d.leading(leader), 60, "the old leader back, following")
    await until(lambda: d.leader() == new, 15, f"{new} still leading")  # a poll may time out
    await until(lambda: d.weights(leader, "ewr") == d.weights(new, "ewr"), 30,
                "the old leader serving the leader's weights")
    d.fault("{}")
    print(f"partition: new leader after {took:.1f} s (lease {LEASE_S} s), "
          f"{time.monotonic() - cut:.0f} s until rejoined")


async def _upgrade(d: Deployment, runbook: list[Block]) -> None:
    """Step 9: the order from `ballast status`, the leader last; a release that never gets
    ready fails the wait and is rolled back; the new release everywhere; an edge's Envoy."""
    leader = d.leader()
    (order_text,) = d.run_step("upgrade-order", runbook).values()
    order = order_text.split()
    assert sorted(order) == sorted(CONTROL) and order[-1] == leader, (order, leader)
    # a release whose replica never gets ready: the wait fails, non-zero, on the first host
    _release(d, runbook, BROKEN_VERSION, broken=True)
    version = d.block("replica-version", runbook, order[0])
    began = time.monotonic()
    failed = d.run_block(version, order[0], fails=True, TO=BROKEN_VERSION)
    assert time.monotonic() - began >= READY_WAIT_S
    assert f"{order[0]}: not ready after {READY_WAIT_S} s: roll it back" in failed.stderr
    # the rollback: the same block back to the running version; ready again
    d.run_block(version, order[0], TO=VERSION)
    assert _installed_version(d) == VERSION
    await until(lambda: d.leader() is not None, 30, "a leader after the rollback")
    # the new release, host by host in that order; after each, three replicas, one leader
    _release(d, runbook, NEW_VERSION)
    for name in order:
        d.run_block(version, name, TO=NEW_VERSION)
        await until(lambda: d.leader() is not None, 30, f"a leader after upgrading {name}")
    assert _installed_version(d) == NEW_VERSION
    assert all(d.admin(n, "/readyz").get("ready") for n in CONTROL)
    # an edge's Envoy: validated, drained, restarted, back and synced
    before = d.envoy_pid("edge-ewr")
    d.run_block(d.block("edge-upgrade", runbook, "edge-ewr"), "edge-ewr", TO=NEW_VERSION)
    assert d.envoy_pid("edge-ewr") != before
    await until(lambda: "ewr-edge-1" in _synced(d), 60, "ewr's Envoy back, SYNCED")
    d.extra["VERSION"] = NEW_VERSION


async def _rotations(d: Deployment, runbook: list[Block], traffic: Path) -> None:
    """Step 10: server and node certificates (no Envoy restart, no request lost), etcd's, the
    admin token."""
    before = {n: d.admin(n, "/status").get("xds_tls", {}).get("serial") for n in CONTROL}
    pids = {edge: d.envoy_pid(edge) for edge in EDGES}
    since = time.time()
    d.run_step("rotate", runbook)
    d.run_step("rotate-server", runbook)
    d.run_step("node-cert", runbook)
    d.run_step("rotate-check", runbook)
    assert {edge: d.envoy_pid(edge) for edge in EDGES} == pids  # no Envoy restarted
    answered = _statuses(traffic, since)
    assert all(s and s.count(200) == len(s) for s in answered.values()), answered
    for edge in EDGES:
        assert [p.name for p in d.path(edge, "/etc/envoy/tls").glob("node.*")] == \
            [os.readlink(d.path(edge, "/etc/envoy/tls/node"))]
        code, stats = d.curl(edge, "http://127.0.0.1:9901/stats?filter=key_rotation_failed")
        assert code == 200 and stats.strip() and ": 0" in stats and ": 1" not in stats, stats
    await until(lambda: all(d.admin(n, "/status").get("xds_tls", {}).get("serial")
                            not in (None, before[n]) for n in CONTROL), 30,
                "every replica serving its new certificate")
    # etcd's member and client certificates
    members = d.etcdctl("member", "list")
    d.run_step("rotate-etcd", runbook)
    d.run_step("etcd-cert", runbook)
    d.run_step("rotate-etcd-apply", runbook)
    d.run_step("etcd-health", runbook)
    assert d.etcdctl("member", "list") == members
    await until(lambda: all(d.admin(n, "/status").get("replication", {}).get("store_reachable")
                            for n in CONTROL), 30, "every replica reaching etcd")
    # a new admin token: the CLI with it, and Prometheus scraping with its new copy
    old = d.path("ballast-a", "/etc/ballast/tls/admin.token").read_text()
    d.run_step("rotate-token", runbook)
    d.run_step("rotate-token-apply", runbook)
    assert d.path("ballast-a", "/etc/ballast/tls/admin.token").read_text() != old
    (status,) = d.run_step("verify", runbook).values()
    assert "ewr-edge-1" in status and "sjc-edge-1" in status, status
    since = time.time()
    await until(lambda: _targets_up(d, 5) and _scraped_after(d, since), 30,
                "Prometheus scraping the replicas with the new token")


async def _backup_and_restore(d: Deployment, runbook: list[Block]) -> None:
    """Step 11: the snapshot service copies a checked snapshot off the host; a restore of the
    whole cluster from one gives back the intent it holds."""
    d.run_step("backup", runbook)
    backups = d.path("prometheus", BACKUP_DIR)
    assert [p.name for p in backups.glob("etcd-ballast-a-*.db")], list(backups.iterdir())
    d.run_step("stop", runbook)
    # the timer fires: a snapshot of the intent the stopped replicas left
    fired = d.host("ballast-a").run(["systemctl", "start", "ballast-etcd-snapshot.service"],
                                    env=d.env("ballast-a"), timeout=120)
    assert fired.returncode == 0, fired.stderr + d.logs()
    snapshot = max(p.name for p in backups.glob("etcd-ballast-a-*.db"))
    intent = d.etcdctl("get", "--prefix", "/ballast/intent/")
    assert "/ballast/intent/groups/ewr/shop" in intent
    d.etcdctl("del", "--prefix", "/ballast/intent/")  # what the restore must give back
    d.run_step("restore-fetch", runbook, SNAPSHOT=snapshot)
    d.run_step("restore", runbook, SNAPSHOT=snapshot)
    d.run_step("etcd-health", runbook)
    assert d.etcdctl("get", "--prefix", "/ballast/intent/") == intent
    d.run_step("start", runbook)
    await until(lambda: all(d.admin(n, "/readyz").get("ready") for n in CONTROL), 60,
                "three replicas ready after the restore")
    await until(lambda: d.leader() is not None, 30, "a leader after the restore")


async def _etcd_member_replaced(d: Deployment, runbook: list[Block]) -> None:
    """Step 12: ballast-c's member out and in again with an empty data directory."""
    before = d.etcdctl("member", "list")
    d.run_step("etcd-replace", runbook)
    d.run_step("etcd-rejoin", runbook)
    d.run_step("etcd-health", runbook)
    after = d.etcdctl("member", "list")
    c = [line for line in after.splitlines() if ", ballast-c, " in line]
    assert len(after.splitlines()) == 3 and c and c[0].split(", ")[1] == "started", after
    assert c[0].split(",")[0] not in before  # a new member
    await until(lambda: d.admin("ballast-c", "/status").get("replication", {})
                .get("store_reachable") is True and d.leader() is not None, 30,
                "ballast-c's replica on its new member, a leader")


async def _new_edge(d: Deployment, runbook: list[Block]) -> None:
    """Step 12: a second edge in ewr, from its names and key to Prometheus scraping it."""
    host, _, node = NEW_EDGE
    d.extra["NEW_EDGE"] = ADDRESSES[host]
    d.extra["EDGES"] = f"{SITE['EDGES']} {ADDRESSES[host]}"
    for step in ("names", "ssh-authorize"):
        d.run_block(d.block(step, runbook, "ballast-a"), host)
    wheel = d.path("ballast-a", f"/root/ballast_xds-{NEW_VERSION}-py3-none-any.whl")
    scp = subprocess.run(["scp", str(wheel), f"{host}:/root/"], env=d.env("ballast-a"),
                         timeout=60, capture_output=True, text=True)
    assert scp.returncode == 0, scp.stderr  # step 1's wheel block, for the new host
    for step in ("users", "firewall"):
        d.run_block(d.block(step, runbook, "edge-ewr"), host)
    d.run_step("add-edge", runbook)
    for step in ("node-cert", "envoy"):
        d.run_block(d.block(step, runbook, "edge-ewr"), host)
    d.run_step("firewall", runbook, hosts=CONTROL)
    d.run_step("add-edge-prometheus", runbook)
    await until(lambda: node in _synced(d), 60, f"{node} connected and SYNCED")
    await until(lambda: _targets_up(d, 6), 60, "Prometheus: three edges and three replicas up")
    (status,) = d.run_step("verify", runbook).values()
    assert node in status, status


def _synced(d: Deployment) -> set[str]:
    return {n["node_id"] for r in CONTROL for n in d.admin(r, "/nodes").get("nodes", [])
            if n.get("status") == "SYNCED"}


def _scraped_after(d: Deployment, since: float) -> bool:
    code, body = d.curl("prometheus", f"http://{ADDRESSES['prometheus']}:9090/api/v1/targets")
    active = json.loads(body)["data"]["activeTargets"] if code == 200 else []
    replicas = [t for t in active if t["labels"].get("job") == "ballast"]
    return len(replicas) == 3 and all(
        t["health"] == "up" and _rfc3339(t["lastScrape"]) > since for t in replicas)


def _rfc3339(text: str) -> float:
    # Prometheus writes nanoseconds; Python's parser takes microseconds
    trimmed = re.sub(r"(\.\d{6})\d+", r"\1", text.replace("Z", "+00:00"))
    return datetime.fromisoformat(trimmed).timestamp()
