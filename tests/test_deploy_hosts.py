"""Issue 25: deploy/README.md's runbook walked on six hosts, from `pip install` to a verified
fleet, through a partition of the leader's host, then upgrade, rotation, backup and restore.

The hosts are network namespaces on a bridge this test makes (`tests/support/netns.py`,
addresses from 198.18.0.0/15): `ballast-a/b/c` (a replica and an etcd member each, etcd with
TLS and client-certificate authentication), `prometheus`, `edge-ewr` and `edge-sjc` (one Envoy
each, mTLS to the replicas, the stats listener for Prometheus) and `origins` (the demo origins
and the clients sending traffic through both edges).

Every fenced block of the runbook marked `runbook=` runs as written, in document order, on the
hosts it names, with the site block replaced by this test's addresses
(`tests/support/runbook.py`). Ballast is installed from a wheel built from this checkout, by the
runbook's own `pip install 'ballast-xds[envoy]'` (pip finds the wheel through PIP_FIND_LINKS),
ONCE: the hosts share that virtualenv (their `/opt/ballast`), installing it six times would
add minutes and test nothing more. Paths a host owns are moved under its own folder. What the
shared machine cannot do for real is played by `tests/support/host_shims.py`: systemd (the same
unit files, run as their User=), `scp` (a copy between the hosts' folders), `useradd` and
`apt-get` (the accounts `ballast` and `envoy` are `nobody` here; etcd and Prometheus are
Debian's packages, already installed).

What it shows: traffic through both edges; a fault on ewr's primary shifts ewr only; the
leader's host taken off the bridge mid-shift → another replica leads within the lease, the
shift goes on and every Envoy applies the leader's weights; the link back → the old leader
follows. And: the admin API refuses a non-loopback address without TLS, and etcd refuses
Ballast without credentials.

Root and `ip netns` needed; 3-7 minutes here, so it runs as `make e2e-hosts` (BALLAST_E2E_HOSTS=1),
not in `make test`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
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
                           ("etcd", "etcdctl", "prometheus", "promtool", "curl", "setpriv")),
                       reason="etcd, etcdctl, prometheus, promtool, curl and setpriv needed"),
    pytest.mark.timeout(900),
]

ADDRESSES = {"ballast-a": "198.18.0.1", "ballast-b": "198.18.0.2", "ballast-c": "198.18.0.3",
             "prometheus": "198.18.0.10", "edge-ewr": "198.18.0.21",
             "edge-sjc": "198.18.0.22", "origins": "198.18.0.30"}
CONTROL = ("ballast-a", "ballast-b", "ballast-c")
EDGES = {"edge-ewr": ("ewr", "ewr-edge-1"), "edge-sjc": ("sjc", "sjc-edge-1")}
SITE = {
    "BALLAST_A": ADDRESSES["ballast-a"], "BALLAST_B": ADDRESSES["ballast-b"],
    "BALLAST_C": ADDRESSES["ballast-c"],
    "REPLICAS": " ".join(ADDRESSES[h] for h in CONTROL),
    "PROMETHEUS": ADDRESSES["prometheus"],
    "EDGE_EWR": ADDRESSES["edge-ewr"], "EDGE_SJC": ADDRESSES["edge-sjc"],
    "SCRAPE_INTERVAL": "1s",  # the desired state (DESIRED) decides over 3 s windows
}
# nearest first: ewr prefers ballast-a, sjc ballast-b
XDS_ORDER = {"edge-ewr": ("ballast-a", "ballast-b", "ballast-c"),
             "edge-sjc": ("ballast-b", "ballast-c", "ballast-a")}
LEASE_S = 5  # the unit's --leader-ttl
ETCD_ELECTION_S = 2  # etcd's default election timeout (1 s) and its campaign
LISTENER = 10000
DESIRED = fast_desired(listener=LISTENER, primary=8081, secondary=8082, sjc_offset=0,
                       listen_address="0.0.0.0", origin_address=ADDRESSES["origins"])
SHIMS = ("systemctl", "scp", "useradd", "apt-get", "chown", "install")


class Deployment:
    """The hosts, their folders, and running the runbook's blocks on them."""

    def __init__(self, net: HostNetwork, top: Path) -> None:
        self.net = net
        self.top = top
        self.roots = top / "hosts"
        self.venv = top / "venv"
        self.bin = top / "bin"
        self.dist = top / "dist"
        self.ran: list[tuple[str, str, float]] = []  # (step, host, seconds)

    def host(self, name: str) -> Host:
        return self.net.hosts[name]

    def env(self, name: str) -> dict[str, str]:
        host = self.host(name)
        env = {"PATH": f"{self.bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": str(self.roots / name / "root"), "LANG": "C.UTF-8",
               "BALLAST_E2E_PYTHON": sys.executable,
               "BALLAST_E2E_ROOTS": str(self.roots), "BALLAST_E2E_HOST": name,
               "BALLAST_E2E_VENV": str(self.venv), "HOST": name, "ADDR": host.address,
               # inside the namespaces there is no package index: the built wheel only
               "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(self.dist),
               **SITE}
        if name in EDGES:
            env["POP"], env["NODE"] = EDGES[name]
            env["XDS"] = " ".join(ADDRESSES[h] for h in XDS_ORDER[name])
        return env

    def path(self, name: str, path: str) -> Path:
        return self.roots / name / path.lstrip("/")

    def run_block(self, block: Block, name: str) -> str:
        text = relocate(block.text, self.roots, name, self.venv)
        started = time.monotonic()
        try:
            done = self.host(name).run(["bash", "-euo", "pipefail", "-c", text],
                                       env=self.env(name), timeout=180, cwd=str(ROOT))
        except subprocess.TimeoutExpired as err:
            raise AssertionError(f"runbook step {block.step} on {name} timed out: "
                                 f"{str(err.stderr)[-2000:]}\n{self.logs()}") from None
        self.ran.append((block.step, name, time.monotonic() - started))
        assert done.returncode == 0, (
            f"runbook step {block.step} on {name} failed ({done.returncode}):\n{text}\n"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}\n"
            f"{self.logs()}")
        return done.stdout

    def logs(self, lines: int = 15) -> str:
        """The tail of every service's log, for a failure's message."""
        out = []
        for log in sorted(self.roots.glob("*/log/*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.relative_to(self.roots)}\n" + "\n".join(tail))
        return "\n".join(out)

    def run_step(self, step: str, runbook: list[Block]) -> dict[str, str]:
        outputs = {}
        for block in (b for b in runbook if b.step == step):
            for name in block.hosts:
                outputs[name] = self.run_block(block, name)
        return outputs

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
    for name in ADDRESSES:
        (d.roots / name / "root").mkdir(parents=True)
        d.path(name, "/root").chmod(0o700)
        for folder in ("/etc", "/var/lib", "/etc/systemd/system", "/etc/default"):
            d.path(name, folder).mkdir(parents=True, exist_ok=True)
        d.roots.joinpath(name).chmod(0o755)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                            "--no-build-isolation", "-w", str(d.dist), str(ROOT)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr


def _install(d: Deployment, runbook: list[Block]) -> float:
    """The install block, once, outside the namespaces (pip needs the package index): its
    virtualenv is every host's /opt/ballast."""
    (install,) = [b for b in runbook if b.step == "install"]
    assert install.hosts == ("all",)
    env = {**d.env("ballast-a"), "PIP_FIND_LINKS": f"{d.dist} /opt/wheels"}
    del env["PIP_NO_INDEX"]
    text = relocate(install.text, d.roots, "ballast-a", d.venv)
    started = time.monotonic()
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", text], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return time.monotonic() - started


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


async def test_the_runbook_on_six_hosts(deployment: Deployment) -> None:
    d = deployment
    runbook = blocks()
    steps = [b.step for b in runbook]
    assert steps[0] == "site" and "install" in steps
    # every command block of deploy/README.md is a runbook block: none escapes this walk
    fences = [line for line in RUNBOOK.read_text().splitlines()
              if line.startswith("```") and line != "```"]
    assert len(fences) == len(runbook), [f for f in fences if "runbook=" not in f]
    started = time.monotonic()
    _prepare(d)
    reuse = os.environ.get("BALLAST_E2E_REUSE_VENV")  # debugging the later steps only
    if reuse:
        d.venv.symlink_to(reuse)
        install_s = 0.0
    else:
        install_s = _install(d, runbook)
    for name in CONTROL:
        d.path(name, "/etc/ballast").mkdir()
        d.path(name, "/etc/ballast/desired.yaml").write_text(DESIRED)
    for step in ("users", "certs", "distribute", "permissions", "etcd", "etcd-auth"):
        d.run_step(step, runbook)
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
    finally:
        stop_pid(origins.pid, timeout=5)
        origins.wait()
    print(f"install {install_s:.0f} s, whole walk {time.monotonic() - started:.0f} s")


async def _deployed_fleet(d: Deployment, runbook: list[Block], traffic: Path) -> None:
    for step in ("replica", "prometheus", "envoy"):
        d.run_step(step, runbook)
    await until(lambda: all(d.admin(n, "/readyz").get("ready") for n in CONTROL), 60,
                "three replicas ready")
    await until(lambda: d.leader() is not None, 30, "a leader")
    await until(lambda: _connected(d) >= {"ewr-edge-1", "sjc-edge-1"}, 60,
                "both Envoys connected")
    (status,) = d.run_step("verify", runbook).values()
    assert "LEADER term" in status and "ewr-edge-1" in status and "sjc-edge-1" in status, status
    _refusals(d)

    # Prometheus scrapes every edge's stats listener and every replica's HTTPS /metrics
    def targets_up() -> bool:
        code, body = d.curl("prometheus", f"http://{ADDRESSES['prometheus']}:9090/api/v1/targets")
        active = json.loads(body)["data"]["activeTargets"] if code == 200 else []
        return len(active) == 5 and all(t["health"] == "up" for t in active)

    await until(targets_up, 60, "Prometheus: two edges and three replicas up")
    code, _ = d.curl("prometheus", f"http://{ADDRESSES['edge-ewr']}:9902/config_dump")
    assert code == 404  # the stats listener serves nothing else of the admin
    code, _ = d.curl("prometheus", f"http://{ADDRESSES['edge-ewr']}:9901/ready")
    assert code == 0  # and the admin is not reachable from another host

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

    # upgrade one replica at a time; after each, three replicas serve and one leads
    for block in (b for b in runbook if b.step == "upgrade"):
        for name in block.hosts:
            d.run_block(block, name)
            await until(lambda: d.leader() is not None, 30, f"a leader after upgrading {name}")

    # rotate: new server and node certificates; the Envoys restart and reconnect with them
    before = {n: d.admin(n, "/status").get("xds_tls", {}).get("serial") for n in CONTROL}
    d.run_step("rotate", runbook)
    d.run_step("rotate-apply", runbook)
    await until(lambda: _connected(d) >= {"ewr-edge-1", "sjc-edge-1"}, 60,
                "Envoys back after rotation")
    after = {n: d.admin(n, "/status").get("xds_tls", {}).get("serial") for n in CONTROL}
    assert any(after[n] != before[n] for n in CONTROL), (before, after)
    (status,) = d.run_step("verify", runbook).values()
    assert "ewr-edge-1" in status and "sjc-edge-1" in status, status

    # back up, stop, restore, start: the intent in etcd is the backup's
    d.run_step("backup", runbook)
    backup = d.path("ballast-a", "/root/ballast-intent.backup").read_text()
    assert "/ballast/intent/groups/ewr/shop" in backup
    d.run_step("stop", runbook)
    d.run_step("restore", runbook)
    etcdctl = d.host("ballast-a").run(
        ["etcdctl", "get", "--prefix", "/ballast/intent/"],
        env={"ETCDCTL_API": "3", "ETCDCTL_ENDPOINTS": "https://127.0.0.1:2379",
             "ETCDCTL_CACERT": str(d.path("ballast-a", "/root/ballast-ca/etcd/ca.pem")),
             "ETCDCTL_CERT": str(d.path("ballast-a", "/root/ballast-ca/etcd/clients/root.pem")),
             "ETCDCTL_KEY": str(d.path("ballast-a", "/root/ballast-ca/etcd/clients/root.key")),
             "PATH": "/usr/bin:/bin"})
    assert etcdctl.stdout == backup
    d.run_step("start", runbook)
    await until(lambda: all(d.admin(n, "/readyz").get("ready") for n in CONTROL), 60,
                "three replicas ready after the restore")
    await until(lambda: d.leader() is not None, 30, "a leader after the restore")
    # every runbook block ran (the install block once, for the shared virtualenv)
    ran = {step for step, _, _ in d.ran} | {"site", "install"}
    assert ran == set(b.step for b in runbook), set(b.step for b in runbook) - ran
