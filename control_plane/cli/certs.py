"""`ballast certs DIR`: a CA, Ballast's server certificate and node/admin client certificates,
and for replicas etcd's CA, its members' certificate and etcd client certificates.

For the demo, the tests and trying mTLS out; production fleets bring their own PKI with the same
URI SANs (`docs/security.md`). The CA is made once and reused; the server certificate is made
when missing (or with --renew-server); each --node and --admin certificate is (re)issued.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from control_plane.security.cert_dir import CertDir
from control_plane.security.certs import DEFAULT_DAYS

HELP = "make a CA, a server certificate and node/admin client certificates for mTLS"


def _node(text: str) -> tuple[str, str]:
    pop, slash, node_id = text.partition("/")
    if not slash or not pop or not node_id:
        raise argparse.ArgumentTypeError(f"{text!r}: expected POP/NODE_ID, e.g. ewr/ewr-edge-1")
    return pop, node_id


def _days(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 3650:
        raise argparse.ArgumentTypeError(f"{text!r}: days must be 1..3650")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", type=Path, help="directory for the files (made if missing)")
    parser.add_argument("--host", action="append", default=None, metavar="HOST",
                        help="a name or address Envoys reach Ballast by; repeat "
                        "(default 127.0.0.1 and localhost)")
    parser.add_argument("--node", action="append", type=_node, default=[], metavar="POP/ID",
                        help="a node certificate for node ID of PoP POP; repeat")
    parser.add_argument("--admin", action="append", default=[], metavar="NAME",
                        help="an admin API client certificate; repeat")
    parser.add_argument("--etcd-member", action="append", default=[], metavar="HOST",
                        help="a name or address of an etcd member; repeat for every member: "
                        "one certificate naming them all, for clients and peers "
                        "(DIR/etcd/member.pem, signed by etcd's own CA DIR/etcd/ca.pem)")
    parser.add_argument("--etcd-client", action="append", default=[], metavar="USER",
                        help="an etcd client certificate whose CN is USER (etcd's "
                        "--client-cert-auth takes it as that user); repeat")
    parser.add_argument("--admin-token", action="store_true",
                        help="also write DIR/admin.token, a new random admin API token "
                        "(for serve --admin-token-file and the CLI's --token-file), and "
                        "DIR/scrape.token, a read-only one for GET /metrics (serve "
                        "--admin-scrape-token-file; Prometheus's)")
    parser.add_argument("--renew-server", action="store_true",
                        help="issue a new server certificate even if one exists (rotation: a "
                        "running `ballast serve` uses it from its next connection on)")
    parser.add_argument("--days", type=_days, default=DEFAULT_DAYS,
                        help=f"validity of what is made (default {DEFAULT_DAYS})")


def run(args: argparse.Namespace) -> int:
    certs = CertDir(args.dir)
    try:
        ca, made = certs.load_or_make_ca(args.days)
        written = [certs.ca.cert] if made else []
        if made or args.renew_server or not certs.server.cert.exists():
            hosts = args.host or ["127.0.0.1", "localhost"]
            written.append(certs.make_server(ca, hosts, args.days).cert)
        written += [certs.make_node(ca, pop, node_id, args.days).cert
                    for pop, node_id in args.node]
        written += [certs.make_admin(ca, name, args.days).cert for name in args.admin]
        if args.etcd_member or args.etcd_client:
            etcd_ca, made = certs.load_or_make_ca(args.days, etcd=True)
            written += [certs.etcd_ca.cert] if made else []
            if args.etcd_member:
                written.append(certs.make_etcd_member(etcd_ca, args.etcd_member, args.days).cert)
            written += [certs.make_etcd_client(etcd_ca, user, args.days).cert
                        for user in args.etcd_client]
        token = certs.make_admin_token() if args.admin_token else None
        scrape = certs.make_scrape_token() if args.admin_token else None
    except (OSError, ValueError) as err:
        print(f"ballast certs: {err}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path} (key {path.with_suffix('.key')})")
    if token is not None and scrape is not None:
        print(f"wrote {token} (serve --admin-token-file {token}; CLI --token-file {token})")
        print(f"wrote {scrape} (serve --admin-scrape-token-file {scrape}; Prometheus: "
              f"prometheus-config --token-file {scrape}; it reads /metrics and nothing else)")
    print(f"serve with: --tls-cert {certs.server.cert} --tls-key {certs.server.key} "
          f"--client-ca {certs.ca.cert}")
    return 0
