"""Certificates for the demo and the tests: a CA, the server's certificate, node and admin
client certificates (ECDSA P-256, X.509 v3), made with the `cryptography` package.

`ballast certs DIR` writes them (see `control_plane/cli/certs.py`); production fleets bring their
own PKI, with the same URI SANs (`control_plane/security/identity.py`).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_DAYS = 365
# A certificate is valid from a little before it is made: clocks of peers differ.
BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    def key(self) -> ec.EllipticCurvePrivateKey:
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("not an EC private key")
        return key


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ballast"),
        x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64]),
    ])


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey,
             days: int, now: datetime.datetime) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def make_ca(common_name: str = "ballast CA", *, days: int = DEFAULT_DAYS) -> Issued:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        _builder(_name(common_name), _name(common_name), key.public_key(), days, now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                          content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, encipher_only=False,
                          decipher_only=False),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _issue(
    ca: Issued,
    common_name: str,
    names: list[x509.GeneralName],
    usage: list[x509.ObjectIdentifier],
    days: int,
) -> Issued:
    key = _key()
    ca_cert = ca.cert
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        _builder(_name(common_name), ca_cert.subject, key.public_key(), days, now)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                          content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=True, encipher_only=False,
                          decipher_only=False),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key().public_key()),
            critical=False,
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca.key(), hashes.SHA256())
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _host_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def issue_server(ca: Issued, hosts: list[str], *, days: int = DEFAULT_DAYS) -> Issued:
    """Ballast's certificate: valid for each of `hosts` (IP addresses or DNS names)."""
    if not hosts:
        raise ValueError("a server certificate needs at least one host name or address")
    return _issue(ca, hosts[0], [_host_name(h) for h in hosts],
                  [ExtendedKeyUsageOID.SERVER_AUTH], days)


def issue_etcd_member(ca: Issued, hosts: list[str], *, days: int = DEFAULT_DAYS) -> Issued:
    """An etcd member's certificate, for its clients and its peers alike: valid for each of
    `hosts`, usable as server and as client (a member dials the others)."""
    if not hosts:
        raise ValueError("an etcd member certificate needs at least one host name or address")
    return _issue(ca, hosts[0], [_host_name(h) for h in hosts],
                  [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH], days)


def issue_etcd_client(ca: Issued, user: str, *, days: int = DEFAULT_DAYS) -> Issued:
    """An etcd client certificate: etcd with --client-cert-auth takes its CN as the user."""
    return _issue(ca, user, [], [ExtendedKeyUsageOID.CLIENT_AUTH], days)


def issue_client(ca: Issued, uri: str, common_name: str, *, days: int = DEFAULT_DAYS) -> Issued:
    """A client certificate whose identity is the URI SAN `uri` (a node or an admin)."""
    return _issue(ca, common_name, [x509.UniformResourceIdentifier(uri)],
                  [ExtendedKeyUsageOID.CLIENT_AUTH], days)


def uri_sans(cert_pem: bytes) -> list[str]:
    """The URI SANs of a PEM certificate (empty when it has none or cannot be read)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except (ValueError, x509.ExtensionNotFound):
        return []
    return list(sans.value.get_values_for_type(x509.UniformResourceIdentifier))
