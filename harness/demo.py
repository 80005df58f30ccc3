"""`make run`: Ballast doing real work on one machine.

Starts the control plane on a desired-state file, one demo origin per origin of the file (on the
addresses it names), one real Envoy per PoP bootstrapped from Ballast (metrics sink on), and a
light steady stream of requests through every PoP so the reconcile loop has signals to act on.
Envoys reach Ballast over mTLS, with certificates `ballast certs` would make (in STATE/certs);
the admin API wants the token in STATE/certs/admin.token.
Prints where to send requests, how to break an origin and where to watch. Ctrl-C stops it all.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from control_plane.cli.envoy_validate import EnvoyNotFound
from control_plane.desired import DesiredStateError, load_desired
from control_plane.desired.model import Desired
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.security.cert_dir import CertDir
from control_plane.security.tls import TlsFiles
from control_plane.translate.bootstrap import XdsClientTls, ads_bootstrap
from harness.demo_origin import DemoOrigin
from harness.envoy_process import EnvoyProcess
from harness.traffic import steady_traffic, stop_tasks

XDS_PORT = 18000
ADMIN_PORT = 18001
FIRST_ENVOY_ADMIN_PORT = 9901


TRAFFIC_PATHS = ("/api/checkout/cart", "/", "/img/hero.png", "/auth/login")


def _guide(
    desired: Desired, envoys: dict[str, EnvoyProcess], state_dir: Path, admin_port: int,
    token: Path,
) -> str:
    lines = ["", "Ballast demo fleet is up (Envoys reach Ballast over mTLS, certificates in "
             f"{state_dir / 'certs'}).", ""]
    for pop in desired.pops:
        for listener in desired.listeners:
            port = listener.port + pop.port_offset
            lines.append(f"  PoP {pop.name}: curl -si http://{pop.listen_address}:{port}/api/"
                         f"checkout   (Envoy admin http://127.0.0.1:{envoys[pop.name].admin_port})")
    group = desired.origin_groups[0]
    first = group.origins[0]
    pop = desired.pops[0].name
    lines += [
        "",
        f"  Break {first.name} for PoP {pop} only (60% 503s) and watch weights move:",
        f"    curl -s -XPOST http://{first.address}:{first.port}/_ballast/fault "
        f"-d '{{\"error_rate\": 0.6, \"pops\": [\"{pop}\"]}}'",
        f"    curl -s -XPOST http://{first.address}:{first.port}/_ballast/fault -d '{{}}'"
        "   # heal it",
        "",
        f"  Decisions:  .venv/bin/ballast decisions --state-dir {state_dir} --follow",
        f"  Why:        .venv/bin/ballast explain --state-dir {state_dir} --pop {pop} "
        f"--group {group.name}",
        f"  Nodes:      .venv/bin/ballast status --server http://127.0.0.1:{admin_port} "
        f"--token-file {token}",
        f"  Roll out:   edit {desired.source} (e.g. a classification rule), then "
        f".venv/bin/ballast rollout status --server http://127.0.0.1:{admin_port} "
        f"--token-file {token}",
        f"              {pop} (the canary) gets it first, the others after its bake and "
        "gate; `ballast rollout promote|abort|pause` there too",
        f"  Admin API:  curl -H \"Authorization: Bearer $(cat {token})\" "
        f"http://127.0.0.1:{admin_port}/status   (/metrics /weights ...)",
        f"  Dashboard:  http://127.0.0.1:{admin_port}/login with the token in {token}, "
        f"then http://127.0.0.1:{admin_port}/dashboard/",
        "",
        f"Weights and the decision log live in {state_dir}: the next run resumes from them "
        "(`make reset` starts clean; ports: `make run XDS_PORT=... ADMIN_PORT=... "
        "ENVOY_ADMIN_PORT=...`).",
        "Ctrl-C stops everything.",
    ]
    return "\n".join(lines)


def node_id(pop: str) -> str:
    return f"{pop}-edge-1"


def demo_certs(directory: Path, desired: Desired, days: int = 365) -> CertDir:
    """A CA (kept across runs), Ballast's certificate, one node certificate per PoP and an
    admin token."""
    certs = CertDir(directory)
    ca, _ = certs.load_or_make_ca(days)
    certs.make_server(ca, ["127.0.0.1", "localhost"], days)
    for pop in desired.pops:
        certs.make_node(ca, pop.name, node_id(pop.name), days)
    certs.make_admin_token()
    return certs


async def run_demo(
    path: Path,
    state_dir: Path,
    rps: float,
    *,
    xds_port: int = XDS_PORT,
    admin_port: int = ADMIN_PORT,
    envoy_admin_port: int = FIRST_ENVOY_ADMIN_PORT,
) -> int:
    try:
        desired = load_desired(path)
    except DesiredStateError as err:
        print(err, file=sys.stderr)
        return 1
    origins = [
        DemoOrigin(origin.name, origin.port, origin.address)
        for group in desired.origin_groups
        for origin in group.origins
    ]
    certs = demo_certs(state_dir / "certs", desired)
    service = BallastService(
        ServiceConfig(
            desired_path=path,
            state_dir=state_dir,
            xds_address=f"127.0.0.1:{xds_port}",
            admin_address=f"127.0.0.1:{admin_port}",
            tls=TlsFiles(certs.server.cert, certs.server.key, certs.ca.cert),
            admin_token_file=certs.admin_token,
        )
    )
    envoys: dict[str, EnvoyProcess] = {}
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        for origin in origins:
            await origin.start()
        await service.start()
        for index, pop in enumerate(desired.pops):
            admin = envoy_admin_port + index
            node = certs.node(pop.name, node_id(pop.name))
            bootstrap = ads_bootstrap(
                node_id=node_id(pop.name),
                pop=pop.name,
                xds_port=xds_port,
                admin_port=admin,
                metrics_sink=True,
                needed_stats_only=True,
                tls=XdsClientTls(cert=str(node.cert.absolute()), key=str(node.key.absolute()),
                                 ca=str(certs.ca.cert.absolute())),
            )
            envoys[pop.name] = EnvoyProcess(
                bootstrap, admin, log_path=state_dir / f"envoy-{pop.name}.log"
            ).start()
        for envoy in envoys.values():
            await asyncio.to_thread(envoy.wait_ready, 20)
        service.install_signal_handlers(stop)
        for pop in desired.pops:
            for listener in desired.listeners:
                url = f"http://{pop.listen_address}:{listener.port + pop.port_offset}"
                tasks.append(asyncio.create_task(steady_traffic(url, TRAFFIC_PATHS, rps, stop)))
        print(_guide(desired, envoys, state_dir, admin_port, certs.admin_token), flush=True)
        await stop.wait()
        return 0
    except (OSError, EnvoyNotFound, TimeoutError, RuntimeError) as err:
        print(f"demo: {err}", file=sys.stderr)
        return 1
    finally:
        await stop_tasks(stop, tasks)
        for envoy in envoys.values():
            envoy.stop()
        if service.ready:
            await service.stop()
        for origin in origins:
            await origin.stop()
        print("demo stopped", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.demo", description=__doc__)
    parser.add_argument("file", type=Path, help="desired-state YAML")
    parser.add_argument("--state-dir", type=Path, default=Path("var/demo"))
    parser.add_argument("--rps", type=float, default=10.0, help="requests/s per PoP listener")
    parser.add_argument("--xds-port", type=int, default=XDS_PORT)
    parser.add_argument("--admin-port", type=int, default=ADMIN_PORT)
    parser.add_argument("--envoy-admin-port", type=int, default=FIRST_ENVOY_ADMIN_PORT,
                        help="admin port of the first PoP's Envoy; the next PoPs count up")
    args = parser.parse_args(argv)
    args.state_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        filename=args.state_dir / "ballast.log",
    )
    return asyncio.run(
        run_demo(
            args.file,
            args.state_dir,
            args.rps,
            xds_port=args.xds_port,
            admin_port=args.admin_port,
            envoy_admin_port=args.envoy_admin_port,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
