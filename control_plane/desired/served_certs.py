"""The certificates TLS listeners serve, judged when the desired state is read (pure: the bytes
and the time come in as arguments).

A pair is accepted when the certificate chain and the private key parse as PEM, the key belongs
to the leaf certificate, the leaf is valid now, and its subject alt names cover every hostname
it is served for (a `*.example.com` SAN covers `shop.example.com`, not `a.b.example.com`).
Anything else raises `Bad` saying which of these failed.

A certificate file (a chain, a client CA) holds `CERTIFICATE` PEM blocks and nothing else: a
private key in it (a "combined PEM" of certificate and key) is refused, naming the file, the
line of the block and its type, and so is any other block. What is served is never the file's
bytes: the chain is written again from the certificates parsed out of it (`chain_pem`), so
whatever else the file holds — a key outside any block, comments — cannot reach Envoy, a
rendering or the decision log.
"""

from __future__ import annotations

import hashlib
import re

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from control_plane.desired.fields import Bad
from control_plane.desired.model import ServedCertificate

DAY_S = 86_400
MAX_CHAIN = 8  # certificates in one chain file
PEM_BEGIN = re.compile(rb"-----BEGIN ([^\r\n-]*)-----")


def load_chain(chain_pem: bytes, what: str) -> list[x509.Certificate]:
    """The certificates of a certificate file; Bad for a block of another type (a private key
    above all: file and line named) or none at all."""
    for block in PEM_BEGIN.finditer(chain_pem):
        label = block.group(1).decode("ascii", "replace").strip()
        if label == "CERTIFICATE":
            continue
        line = chain_pem.count(b"\n", 0, block.start()) + 1
        if "PRIVATE" in label.upper():
            raise Bad(f"{what}:{line}: holds a private key ({label}): a certificate file holds "
                      "certificates only; keep the key in key_file alone")
        raise Bad(f"{what}:{line}: a {label or 'nameless'} PEM block; a certificate file holds "
                  "CERTIFICATE blocks only")
    try:
        chain = x509.load_pem_x509_certificates(chain_pem)
    except ValueError:
        raise Bad(f"{what}: no PEM certificate in it") from None
    if len(chain) > MAX_CHAIN:
        raise Bad(f"{what}: {len(chain)} certificates; at most {MAX_CHAIN} in a chain")
    return chain


def chain_pem(chain: list[x509.Certificate]) -> bytes:
    """The certificates as PEM, written from what was parsed: nothing else of their file."""
    return b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert in chain)


def public_key_der(key: object) -> bytes:
    public = key.public_key()  # type: ignore[attr-defined]
    return bytes(public.public_bytes(serialization.Encoding.DER,
                                     serialization.PublicFormat.SubjectPublicKeyInfo))


def check_key_matches(leaf: x509.Certificate, key_pem: bytes, key_file: str) -> None:
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise Bad(f"{key_file}: not an unencrypted PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
                      | ed25519.Ed25519PrivateKey):
        raise Bad(f"{key_file}: an unsupported key type (use EC or RSA)")
    leaf_spki = leaf.public_key().public_bytes(serialization.Encoding.DER,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    if public_key_der(key) != leaf_spki:
        raise Bad(f"the private key in {key_file} does not match the certificate (a renewal "
                  "half-written, or the wrong key file)")


def san_names(leaf: x509.Certificate) -> list[str]:
    try:
        extension = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return [name.lower() for name in extension.value.get_values_for_type(x509.DNSName)]


def covers(san: str, hostname: str) -> bool:
    """Whether the SAN `san` covers `hostname` (one wildcard label at the left, RFC 6125)."""
    san, hostname = san.lower(), hostname.lower()
    if san == hostname:
        return True
    if san.startswith("*.") and hostname.startswith("*."):
        return False
    if san.startswith("*."):
        head, _, rest = hostname.partition(".")
        return bool(head) and rest == san[2:]
    return False


def served_certificate(
    name: str,
    secret_name: str,
    hostnames: tuple[str, ...],
    files: tuple[str, str],
    pems: tuple[bytes, bytes],
    now: float,
) -> ServedCertificate:
    """The checked pair (its dates judged at `now`, unix seconds), or `Bad` naming the first
    thing wrong with it."""
    cert_file, key_file = files
    chain_file, key_pem = pems
    chain = load_chain(chain_file, cert_file)
    leaf = chain[0]
    check_key_matches(leaf, key_pem, key_file)
    not_before = leaf.not_valid_before_utc.timestamp()
    not_after = leaf.not_valid_after_utc.timestamp()
    if now < not_before:
        since = leaf.not_valid_before_utc.strftime("%Y-%m-%d %H:%M")
        raise Bad(f"{cert_file}: not valid yet (valid from {since} UTC)")
    if now >= not_after:
        until = leaf.not_valid_after_utc.strftime("%Y-%m-%d %H:%M")
        raise Bad(f"{cert_file}: expired on {until} UTC")
    sans = san_names(leaf)
    for hostname in hostnames:
        if not any(covers(san, hostname) for san in sans):
            raise Bad(f"{cert_file}: its subject alt names ({', '.join(sans) or 'none'}) do not "
                      f"cover hostname {hostname!r}")
    return ServedCertificate(
        name=name,
        secret_name=secret_name,
        hostnames=hostnames,
        cert_file=cert_file,
        key_file=key_file,
        chain_pem=chain_pem(chain),
        key_pem=key_pem,
        fingerprint=hashlib.sha256(leaf.public_bytes(serialization.Encoding.DER)).hexdigest(),
        key_fingerprint=key_fingerprint(key_pem),
        not_after_s=not_after,
        subject=leaf.subject.rfc4514_string(),
    )


def key_fingerprint(key_pem: bytes) -> str:
    return hashlib.sha256(key_pem).hexdigest()[:16]


def days_left(certificate: ServedCertificate, now_s: float) -> float:
    return (certificate.not_after_s - now_s) / DAY_S
