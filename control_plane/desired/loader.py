"""Loading a desired-state file: bytes to a validated, immutable `Desired`, or every problem.

`load_desired(path)` and `parse_desired(text, source)` either return a complete model or raise
`DesiredStateError` listing all problems of the file at once; nothing half-valid escapes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
import time
from pathlib import Path

from control_plane.desired.errors import At, DesiredStateError, Problem, Sink
from control_plane.desired.filter_types import DEFAULT_ALLOWED, AllowedFilters
from control_plane.desired.model import Desired
from control_plane.desired.validate import build_desired
from control_plane.desired.yaml_nodes import compose

MAX_FILE_BYTES = 1024 * 1024


def read_desired_bytes(path: str | Path) -> bytes:
    """The bytes of a desired-state file: a regular file (symlinks followed) of at most
    `MAX_FILE_BYTES`, read without ever blocking on a FIFO or reading a device without end;
    DesiredStateError otherwise."""
    source = str(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; regular files ignore it
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            status = os.fstat(fd)
            if not stat.S_ISREG(status.st_mode):
                raise DesiredStateError([Problem(
                    source, 0, 0, "", f"not a regular file ({_file_kind(status.st_mode)}); "
                    "the desired state must be a file")])
            if status.st_size > MAX_FILE_BYTES:
                raise DesiredStateError([_too_large(source, status.st_size)])
            with os.fdopen(os.dup(fd), "rb") as handle:
                data = handle.read(MAX_FILE_BYTES + 1)  # the file may grow after fstat
        finally:
            os.close(fd)
    except OSError as error:
        reason = error.strerror or str(error)
        problem = Problem(source, 0, 0, "", f"cannot read file: {reason}")
        raise DesiredStateError([problem]) from None
    if len(data) > MAX_FILE_BYTES:
        raise DesiredStateError([_too_large(source, len(data))])
    return data


def load_desired(path: str | Path, allowed_filters: AllowedFilters = DEFAULT_ALLOWED
                 ) -> Desired:
    """Read and validate a desired-state file; `source` in problems is `path` as given."""
    return parse_desired(read_desired_bytes(path), str(path), allowed_filters=allowed_filters)


def parse_desired(text: str | bytes, source: str, now_s: float | None = None, *,
                  allowed_filters: AllowedFilters = DEFAULT_ALLOWED) -> Desired:
    """Validate desired-state YAML given as text or bytes (`source` names it in problems);
    the certificate files it names are read and judged at `now_s` (default: now);
    `allowed_filters`: the HTTP filter types it may use (`filter_types.py`; None: any)."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    if len(data) > MAX_FILE_BYTES:
        raise DesiredStateError([_too_large(source, len(data))])
    sink = Sink(source)
    try:
        decoded = data.decode("utf-8")
    except UnicodeDecodeError as error:
        before = data[: error.start]
        line = before.count(b"\n") + 1
        column = len(before) - (before.rfind(b"\n") + 1) + 1
        sink.add(At(line, column, ""), f"not valid UTF-8 (byte 0x{data[error.start]:02x}); "
                 "save the file as UTF-8")
        sink.raise_if_any()
    root = compose(decoded.removeprefix("\ufeff"), sink)
    digest = hashlib.sha256(data).hexdigest()
    files = LocalFiles(time.time() if now_s is None else now_s)
    desired = build_desired(root, sink, digest, files, allowed_filters) \
        if root is not None else None
    sink.raise_if_any()
    assert desired is not None, "a document without problems always builds"
    if files.read_any:  # the files' contents are part of what the version identifies
        desired = dataclasses.replace(desired,
                                      digest=version_digest(data, files_read(desired)))
    return desired


FileContents = list[tuple[str, str, str]]


def files_read(desired: Desired) -> FileContents:
    """What the files a desired state names held when it was read, by fingerprint (no secret:
    a key's is a hash): each served certificate's (secret name, certificate, key) and each
    client CA's (`<listener>.client_ca`, its hash, ""). With the file's bytes, they make the
    version's digest (`version_digest`)."""
    read: FileContents = []
    for listener in desired.listeners:
        if listener.tls is None:
            continue
        read += [(c.secret_name, c.fingerprint, c.key_fingerprint)
                 for c in listener.tls.certificates]
        if listener.tls.client_ca_pem is not None:
            read.append((f"{listener.name}.client_ca",
                         hashlib.sha256(listener.tls.client_ca_pem).hexdigest()[:16], ""))
    return read


def version_digest(data: bytes, files: FileContents) -> str:
    """A desired-state version's digest: its bytes, with what the files it names held."""
    if not files:
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha256(data + repr(files).encode()).hexdigest()


class LocalFiles:
    """The files a desired state names (certificates, client CAs), read from this machine:
    regular files of at most `MAX_FILE_BYTES`, with the paths read remembered (the watcher
    watches them)."""

    def __init__(self, now_s: float) -> None:
        self.now_s = now_s
        self.read_any = False

    def read(self, path: str) -> bytes:
        self.read_any = True
        return read_small_file(path)

    def exists(self, path: str) -> bool:
        return os.path.isfile(path)


def read_small_file(path: str | Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """A regular file's bytes (at most `limit`); OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise OSError(0, f"not a regular file ({_file_kind(status.st_mode)})")
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(0, f"larger than {limit:,} bytes")
    return data


def watched_files(desired: Desired) -> tuple[str, ...]:
    """The files besides the desired state itself whose contents it holds: a change in one is
    a new desired state (certificate renewals)."""
    paths: list[str] = []
    for listener in desired.listeners:
        if listener.tls is None:
            continue
        for cert in listener.tls.certificates:
            paths += [cert.cert_file, cert.key_file]
        if listener.tls.client_ca_file is not None:
            paths.append(listener.tls.client_ca_file)
    return tuple(dict.fromkeys(paths))


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _too_large(source: str, size: int) -> Problem:
    return Problem(source, 0, 0, "", f"file is {size:,} bytes; the limit is 1 MiB "
                   f"({MAX_FILE_BYTES:,} bytes)")
