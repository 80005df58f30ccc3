"""mTLS server credentials (xDS/sink port, and the admin API's HTTPS) whose files are re-read
when they change.

gRPC asks `ReloadingCredentials.fetch` for the certificate configuration at every new TLS
handshake (`grpc.dynamic_ssl_server_credentials`, from one of gRPC's own threads). `fetch` looks
at the three files' (inode, size, mtime): unchanged files cost three `stat` calls; changed ones
are read, checked (the key matches the certificate, the CA parses) and used from the next
handshake on. Connections already open keep the certificate they were made with. A half-written
or broken set is refused with a log line and the last good set stays in use.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

log = logging.getLogger(__name__)


class TlsConfigError(ValueError):
    """The TLS files cannot be used; the message says which and why."""


@dataclass(frozen=True)
class TlsFiles:
    cert: Path  # the server's certificate chain (PEM)
    key: Path  # its private key (PEM)
    client_ca: Path  # CA certificate(s) (PEM) client certificates must chain to


@dataclass(frozen=True)
class LoadedTls:
    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes
    not_after: str  # the server certificate's expiry, ISO 8601
    serial: str  # hex


def _signature(files: TlsFiles) -> tuple[tuple[int, int, int], ...]:
    out = []
    for path in (files.cert, files.key, files.client_ca):
        st = os.stat(path)
        out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _read(path: Path, what: str, limit: int = 1 << 20) -> bytes:
    if not path.is_file():
        raise TlsConfigError(f"{what} {path}: not a regular file")
    with path.open("rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TlsConfigError(f"{what} {path}: larger than {limit} bytes")
    return data


def load_tls(files: TlsFiles) -> LoadedTls:
    """Read and check the three files; TlsConfigError says what is wrong."""
    cert_pem = _read(files.cert, "--tls-cert")
    key_pem = _read(files.key, "--tls-key")
    ca_pem = _read(files.client_ca, "--client-ca")
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError as err:
        raise TlsConfigError(f"--tls-cert {files.cert}: not a PEM certificate: {err}") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as err:
        raise TlsConfigError(f"--tls-key {files.key}: not an unencrypted PEM key: {err}") from None
    try:
        x509.load_pem_x509_certificates(ca_pem)
    except ValueError as err:
        raise TlsConfigError(f"--client-ca {files.client_ca}: not PEM certificates: {err}") \
            from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, public) != \
            chain[0].public_key().public_bytes(serialization.Encoding.DER, public):
        raise TlsConfigError(f"--tls-key {files.key} is not the key of --tls-cert {files.cert}")
    return LoadedTls(cert_pem, key_pem, ca_pem,
                     not_after=chain[0].not_valid_after_utc.isoformat(),
                     serial=f"{chain[0].serial_number:x}")


class ReloadingCredentials:
    """Server credentials that require a client certificate chaining to the client CA, and pick
    up new files at the next handshake after they change."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._lock = threading.Lock()
        self._signature = _signature(files)
        self.loaded = load_tls(files)  # refuse to start on bad files
        self.reloads = 0
        self.last_error: str | None = None

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._configuration(self.loaded), self.fetch, require_client_authentication=True
        )

    @staticmethod
    def _configuration(loaded: LoadedTls) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(loaded.key_pem, loaded.cert_pem)], root_certificates=loaded.ca_pem
        )

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's per-handshake question: a new configuration, or None to keep the current."""
        with self._lock:
            try:
                signature = _signature(self.files)
            except OSError as err:
                self._failed(f"cannot stat the TLS files: {err}")
                return None
            if signature == self._signature:
                return None
            try:
                loaded = load_tls(self.files)
            except (TlsConfigError, OSError) as err:
                self._failed(str(err))  # a rotation half done: retried at the next handshake
                return None
            self._signature = signature
            self.loaded = loaded
            self.reloads += 1
            self.last_error = None
            log.info("TLS files reloaded: server certificate serial %s valid until %s",
                     loaded.serial, loaded.not_after)
            return self._configuration(loaded)

    def _failed(self, message: str) -> None:
        if message != self.last_error:
            log.error("TLS files not reloaded, the last good ones stay in use: %s", message)
        self.last_error = message

    def status(self) -> dict[str, Any]:
        return {
            "cert": str(self.files.cert),
            "client_ca": str(self.files.client_ca),
            "serial": self.loaded.serial,
            "not_after": self.loaded.not_after,
            "reloads": self.reloads,
            "last_error": self.last_error,
        }


class ReloadingSslContext:
    """The same three files as an `ssl.SSLContext` for an HTTPS server (the admin API): client
    certificates are asked for and verified against the client CA but optional (the request's
    authentication decides), and a handshake after the files changed gets a context built from
    the new files (swapped in by the SNI callback, which OpenSSL runs at every handshake)."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._lock = threading.Lock()
        self._signature = _signature(files)
        self._current = self._build(load_tls(files))
        self.context = self._build(load_tls(files))
        self.context.sni_callback = self._pick
        self.reloads = 0
        self.last_error: str | None = None

    def _build(self, loaded: LoadedTls) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=loaded.ca_pem.decode())
        context.verify_mode = ssl.CERT_OPTIONAL
        context.load_cert_chain(self.files.cert, self.files.key)
        return context

    def _pick(self, sock: ssl.SSLObject, server_name: str | None, _: ssl.SSLContext) -> None:
        sock.context = self.current()

    def current(self) -> ssl.SSLContext:
        with self._lock:
            try:
                signature = _signature(self.files)
                if signature != self._signature:
                    self._current = self._build(load_tls(self.files))
                    self._signature = signature
                    self.reloads += 1
                    self.last_error = None
                    log.info("admin TLS files reloaded")
            except (TlsConfigError, OSError, ssl.SSLError) as err:
                if str(err) != self.last_error:
                    log.error("admin TLS files not reloaded, the last good ones stay: %s", err)
                self.last_error = str(err)
            return self._current
