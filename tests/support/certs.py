"""Certificates made by the tests (the `cryptography` package): a CA and leaves signed by it.

Every certificate is an EC P-256 key; validity is given in days relative to now, so a test can
make an expired certificate or one that expires within a probe's warning window.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Issued:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def write(self, directory: Path, stem: str) -> tuple[Path, Path]:
        """(certificate PEM, key PEM) written to `directory`."""
        cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}-key.pem"
        cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        return cert_path, key_path

    @property
    def spki_sha256(self) -> str:
        spki = self.cert.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        return base64.b64encode(hashlib.sha256(spki).digest()).decode()

    @property
    def cert_sha256(self) -> str:
        return hashlib.sha256(self.cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(not_before_days: float, not_after_days: float) -> tuple[datetime.datetime, ...]:
    now = datetime.datetime.now(datetime.UTC)
    return now + datetime.timedelta(days=not_before_days), now + datetime.timedelta(
        days=not_after_days)


def make_ca(common_name: str = "Ballast test CA") -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(-1, 3650)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key)


def make_leaf(
    names: list[str],
    issuer: Issued | None,
    *,
    not_before_days: float = -1,
    not_after_days: float = 90,
) -> Issued:
    """A server certificate for `names` (DNS names or IP addresses) signed by `issuer`, or
    self-signed when `issuer` is None."""
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(not_before_days, not_after_days)
    sans: list[x509.GeneralName] = []
    for item in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(item)))
        except ValueError:
            sans.append(x509.DNSName(item))
    subject = _name(names[0])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.cert.subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(issuer.key if issuer else key, hashes.SHA256())
    )
    return Issued(cert, key)
