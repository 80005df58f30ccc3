"""SDS Secrets: the certificates TLS listeners serve, one `Secret` per certificate, named like
the certificate's `secret_name` (`<listener>.<certificate>`).

The Secret carries the chain and the private key inline; it is the only resource that holds a
private key, so it is what the ADS server keeps from streams that are not mTLS
(`ads/server.py`), and what renderings show redacted (`redacted`): the key becomes its
fingerprint, so `render`, `plan`, `/resources` and the decision log can say that a key changed
without holding it.
"""

from __future__ import annotations

from typing import Any

from envoy.config.core.v3.base_pb2 import DataSource
from envoy.extensions.transport_sockets.tls.v3.common_pb2 import TlsCertificate
from envoy.extensions.transport_sockets.tls.v3.secret_pb2 import Secret

from control_plane.desired.model import ServedCertificate

REDACTED = "redacted"


def secret(certificate: ServedCertificate) -> Secret:
    return Secret(
        name=certificate.secret_name,
        tls_certificate=TlsCertificate(
            certificate_chain=DataSource(inline_bytes=certificate.chain_pem),
            private_key=DataSource(inline_bytes=certificate.key_pem),
        ),
    )


def redacted(rendered: dict[str, Any], key_fingerprint: str) -> dict[str, Any]:
    """A rendered Secret with its private key replaced by the key's fingerprint."""
    tls = rendered.get("tls_certificate", {})
    if "private_key" in tls:
        tls["private_key"] = {REDACTED: f"sha256:{key_fingerprint}"}
    return rendered
