"""Desired states with TLS listeners, and the certificate files they name (tests' own CA).

`TlsSite` writes, for each hostname, a certificate and key signed by one test CA into a folder;
`tls_desired_yaml` is the ADS tests' desired state (`ads_desired.py`) with an HTTPS listener
served only in PoP ewr (certificates `shop` and `media`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from harness.ads_desired import desired_yaml
from tests.support.certs import Issued, make_ca, make_leaf

HOSTNAMES = {"shop": "shop.test", "media": "media.test"}


@dataclass
class TlsSite:
    folder: Path
    ca: Issued = field(default_factory=make_ca)
    issued: dict[str, Issued] = field(default_factory=dict)

    def write(self, name: str, hostname: str, **validity: float) -> Issued:
        """A new certificate for `hostname` as `<name>.pem` + `<name>-key.pem` (replaced
        atomically, each file by a rename, like certbot's)."""
        leaf = make_leaf([hostname], self.ca, **validity)
        self.folder.mkdir(parents=True, exist_ok=True)
        staging = self.folder / ".staging"
        staging.mkdir(exist_ok=True)
        cert, key = leaf.write(staging, name)
        os.replace(cert, self.cert_file(name))
        os.replace(key, self.key_file(name))
        self.issued[name] = leaf
        return leaf

    def cert_file(self, name: str) -> Path:
        return self.folder / f"{name}.pem"

    def key_file(self, name: str) -> Path:
        return self.folder / f"{name}-key.pem"

    def ca_file(self) -> Path:
        path = self.folder / "ca.pem"
        path.write_bytes(self.ca.cert.public_bytes(serialization.Encoding.PEM))
        return path


def key_pem(issued: Issued) -> bytes:
    return issued.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())


def tls_listener_yaml(site: TlsSite, port: int) -> str:
    """An HTTPS listener `https` (certificates shop and media of `site`) in PoP ewr."""
    certs = "".join(
        f"""
          - name: {name}
            hostnames: [{hostname}]
            cert_file: {site.cert_file(name)}
            key_file: {site.key_file(name)}"""
        for name, hostname in HOSTNAMES.items()
    )
    return f"""
  - name: https
    port: {port}
    pops: [ewr]
    tls:
      certificates:{certs}
    virtual_hosts:
      - {{name: all, domains: ["*"], origin_group: shop}}
"""


def tls_desired_yaml(site: TlsSite, *, https_port: int, listener_port: int, primary_port: int,
                     secondary_port: int) -> str:
    """`ads_desired`'s state plus the HTTPS listener (ewr only) on `https_port`."""
    base = desired_yaml(listener_port=listener_port, primary_port=primary_port,
                        secondary_port=secondary_port)
    return base + tls_listener_yaml(site, https_port).lstrip("\n")
