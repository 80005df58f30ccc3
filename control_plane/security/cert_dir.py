"""Where `ballast certs` keeps what it makes, and the writing of it.

    DIR/ca.pem, DIR/ca.key                  the CA (clients and the server trust ca.pem)
    DIR/server.pem, DIR/server.key          Ballast's certificate (--tls-cert, --tls-key)
    DIR/nodes/<pop>/<node id>.pem, .key     one per Envoy node (URI SAN naming PoP and id)
    DIR/admin/<name>.pem, .key              admin API clients
    DIR/admin.token                         a bearer token for the admin API
    DIR/etcd/ca.pem, DIR/etcd/ca.key        etcd's own CA (members and clients trust only it)
    DIR/etcd/member.pem, .key               every etcd member's certificate (server and peer)
    DIR/etcd/clients/<user>.pem, .key       etcd client certificates, CN = the etcd user

etcd has a CA of its own: with --client-cert-auth etcd takes any certificate of its CA as the
user its CN names, so a node or admin certificate of Ballast's CA must not be one.

Each file is written to a temporary name and renamed, keys with mode 0600: a server reloading
the files never reads half a file.
"""

from __future__ import annotations

import datetime
import os
import secrets
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from control_plane.security.certs import (
    Issued,
    issue_client,
    issue_etcd_client,
    issue_etcd_member,
    issue_server,
    make_ca,
)
from control_plane.security.identity import admin_uri, node_uri


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def _file_part(value: str) -> str:
    return urllib.parse.quote(value, safe="-_.@")


class CertDir:
    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def ca(self) -> Pair:
        return Pair(self.root / "ca.pem", self.root / "ca.key")

    @property
    def server(self) -> Pair:
        return Pair(self.root / "server.pem", self.root / "server.key")

    def node(self, pop: str, node_id: str) -> Pair:
        base = self.root / "nodes" / _file_part(pop) / _file_part(node_id)
        return Pair(base.with_name(base.name + ".pem"), base.with_name(base.name + ".key"))

    def admin(self, name: str) -> Pair:
        base = self.root / "admin" / _file_part(name)
        return Pair(base.with_name(base.name + ".pem"), base.with_name(base.name + ".key"))

    @property
    def etcd_ca(self) -> Pair:
        return Pair(self.root / "etcd" / "ca.pem", self.root / "etcd" / "ca.key")

    @property
    def etcd_member(self) -> Pair:
        return Pair(self.root / "etcd" / "member.pem", self.root / "etcd" / "member.key")

    def etcd_client(self, user: str) -> Pair:
        base = self.root / "etcd" / "clients" / _file_part(user)
        return Pair(base.with_name(base.name + ".pem"), base.with_name(base.name + ".key"))

    @property
    def admin_token(self) -> Path:
        return self.root / "admin.token"

    @property
    def scrape_token(self) -> Path:
        return self.root / "scrape.token"

    def make_admin_token(self) -> Path:
        """A new random admin token (256 bits, URL-safe), mode 0600."""
        write_atomic(self.admin_token, (secrets.token_urlsafe(32) + "\n").encode(), 0o600)
        return self.admin_token

    def make_scrape_token(self) -> Path:
        """A new random scrape token (`GET /metrics` only: Prometheus's), mode 0600."""
        write_atomic(self.scrape_token, (secrets.token_urlsafe(32) + "\n").encode(), 0o600)
        return self.scrape_token

    def load_or_make_ca(self, days: int, *, etcd: bool = False) -> tuple[Issued, bool]:
        """The CA in the directory (Ballast's, or etcd's with `etcd`) while it is valid, else a
        new one written there; True when it was made."""
        pair = self.etcd_ca if etcd else self.ca
        if pair.cert.exists() and pair.key.exists():
            ca = Issued(pair.cert.read_bytes(), pair.key.read_bytes())
            if ca.cert.not_valid_after_utc > datetime.datetime.now(datetime.UTC):
                return ca, False
        ca = make_ca("ballast etcd CA" if etcd else "ballast CA", days=days)
        write_pair(pair, ca)
        return ca, True

    def make_server(self, ca: Issued, hosts: list[str], days: int) -> Pair:
        write_pair(self.server, issue_server(ca, hosts, days=days))
        return self.server

    def make_node(self, ca: Issued, pop: str, node_id: str, days: int) -> Pair:
        pair = self.node(pop, node_id)
        write_pair(pair, issue_client(ca, node_uri(pop, node_id), node_id, days=days))
        return pair

    def make_etcd_member(self, ca: Issued, hosts: list[str], days: int) -> Pair:
        write_pair(self.etcd_member, issue_etcd_member(ca, hosts, days=days))
        return self.etcd_member

    def make_etcd_client(self, ca: Issued, user: str, days: int) -> Pair:
        pair = self.etcd_client(user)
        write_pair(pair, issue_etcd_client(ca, user, days=days))
        return pair

    def make_admin(self, ca: Issued, name: str, days: int) -> Pair:
        pair = self.admin(name)
        write_pair(pair, issue_client(ca, admin_uri(name), name, days=days))
        return pair


def write_pair(pair: Pair, issued: Issued) -> None:
    """Key first, then certificate: a reader that sees the new certificate sees its key."""
    write_atomic(pair.key, issued.key_pem, 0o600)
    write_atomic(pair.cert, issued.cert_pem, 0o644)


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)
