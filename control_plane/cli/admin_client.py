"""How CLI commands talk to a running Ballast's admin API (`--server URL`, `$BALLAST_ADMIN`).

The admin token (when the server wants one) comes from `--token-file FILE`, else
`$BALLAST_ADMIN_TOKEN`, else the file named by `$BALLAST_ADMIN_TOKEN_FILE`; it travels as
`Authorization: Bearer`. For an `https://` server, `--cacert` (or `$BALLAST_ADMIN_CACERT`) is
the CA its certificate chains to, and `--cert`/`--key` (`$BALLAST_ADMIN_CERT`/`_KEY`) an admin
client certificate to present instead of a token.

Plain blocking HTTP (urllib): a CLI makes a few requests and exits. Every failure — server not
reachable, an error answer, a body that is not JSON — is an `AdminError` whose message says what
to do; commands print it and exit 1.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import http.client
import json
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from control_plane.decisions.read import Query, Record
from control_plane.security.terminal import escape

DEFAULT_SERVER = "http://127.0.0.1:18001"
SERVER_ENV = "BALLAST_ADMIN"
TOKEN_ENV = "BALLAST_ADMIN_TOKEN"
TOKEN_FILE_ENV = "BALLAST_ADMIN_TOKEN_FILE"
TOKEN_FILE_BYTES = 4096
CACERT_ENV, CERT_ENV, KEY_ENV = "BALLAST_ADMIN_CACERT", "BALLAST_ADMIN_CERT", "BALLAST_ADMIN_KEY"
TIMEOUT_S = 10.0


class AdminError(RuntimeError):
    """The admin API could not answer; `status` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def server_url(text: str) -> str:
    """An `http(s)://host[:port]` URL (argparse type); a trailing slash is dropped."""
    parsed = urllib.parse.urlsplit(text.strip())
    try:
        port_ok = parsed.port is None or parsed.port > 0
    except ValueError:  # not a number, or out of range
        port_ok = False
    if parsed.scheme not in ("http", "https") or not parsed.hostname or not port_ok:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a server URL; expected http://HOST:PORT (e.g. {DEFAULT_SERVER})"
        )
    return text.strip().rstrip("/")


def add_server_option(
    parser: argparse._ActionsContainer, help_text: str, *, defaults: bool = True
) -> None:
    """`--server URL` on a parser or a mutually exclusive group. With `defaults`, the help names
    the fallbacks `resolve_server` applies when it is not given."""
    suffix = f" (default: ${SERVER_ENV} or {DEFAULT_SERVER})" if defaults else ""
    parser.add_argument("--server", type=server_url, metavar="URL", help=help_text + suffix)


def resolve_server(explicit: str | None) -> str:
    """`--server`, else `$BALLAST_ADMIN`, else the default; AdminError for a bad env value."""
    if explicit:
        return explicit
    from_env = os.environ.get(SERVER_ENV)
    if not from_env:
        return DEFAULT_SERVER
    try:
        return server_url(from_env)
    except argparse.ArgumentTypeError as err:
        raise AdminError(f"${SERVER_ENV}: {err}") from None


def add_auth_options(parser: argparse.ArgumentParser) -> None:
    """How to authenticate to the admin API: a token, or (HTTPS) a client certificate."""
    parser.add_argument(
        "--token-file", metavar="FILE",
        help=f"admin API token (default: ${TOKEN_ENV}, or the file ${TOKEN_FILE_ENV} names)",
    )
    parser.add_argument("--cacert", metavar="FILE",
                        help=f"https: the CA of the server's certificate (default ${CACERT_ENV})")
    parser.add_argument("--cert", metavar="FILE",
                        help=f"https: admin client certificate (default ${CERT_ENV})")
    parser.add_argument("--key", metavar="FILE",
                        help=f"https: its private key (default ${KEY_ENV})")


def resolve_token(token_file: str | None) -> str | None:
    """`--token-file`, else `$BALLAST_ADMIN_TOKEN`, else `$BALLAST_ADMIN_TOKEN_FILE`, else none;
    AdminError when a named file cannot be read."""
    path = token_file or os.environ.get(TOKEN_FILE_ENV)
    if token_file is None and os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV].strip()
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(TOKEN_FILE_BYTES + 1)
    except OSError as err:
        raise AdminError(f"cannot read the admin token file {path}: {err.strerror}") from None
    if len(data) > TOKEN_FILE_BYTES:
        raise AdminError(f"admin token file {path}: longer than {TOKEN_FILE_BYTES} bytes")
    return data.decode("ascii", "replace").strip()


def tls_context(
    cacert: str | None, cert: str | None, key: str | None
) -> ssl.SSLContext | None:
    """The client side of HTTPS to the admin API; None when nothing was asked for."""
    cacert = cacert or os.environ.get(CACERT_ENV)
    cert = cert or os.environ.get(CERT_ENV)
    key = key or os.environ.get(KEY_ENV)
    if not (cacert or cert):
        return None
    if bool(cert) != bool(key):
        raise AdminError("a client certificate needs --cert and --key together")
    try:
        context = ssl.create_default_context(cafile=cacert)
        if cert:
            context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        raise AdminError(f"cannot load the admin TLS files: {err}") from None
    return context


def client_for(args: argparse.Namespace) -> AdminClient:
    """The client a command's `--server`, `--token-file`, `--cacert`, `--cert` and `--key` (and
    the environment) ask for."""
    return AdminClient(
        resolve_server(args.server),
        token=resolve_token(args.token_file),
        tls=tls_context(args.cacert, args.cert, args.key),
    )


class AdminClient:
    def __init__(
        self, base_url: str, timeout: float = TIMEOUT_S, *, token: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._tls = tls

    def __str__(self) -> str:
        return self.base_url

    def sibling(self, base_url: str) -> AdminClient:
        """A client of another server (a replica) with the same token and certificates."""
        sibling = AdminClient(base_url, self.timeout, tls=self._tls)
        sibling._headers = dict(self._headers)
        return sibling

    def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """The JSON body of `GET path?params`; AdminError on any failure."""
        return self._json(path, params, "GET")

    def post(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """The JSON body of `POST path?params` (no body: the path and parameters say it all);
        AdminError on any failure."""
        return self._json(path, params, "POST")

    def _json(self, path: str, params: Mapping[str, str] | None, method: str) -> Any:
        with self._open(path, params, method) as (url, response):
            try:
                body = response.read()
            except OSError as err:
                raise AdminError(f"{url}: the answer broke off: {err}") from None
        try:
            return json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise AdminError(
                f"{url}: the answer is not JSON (is this a Ballast admin API?)"
            ) from None

    def items(
        self, path: str, params: Mapping[str, str] | None, key: str
    ) -> Iterator[dict[str, Any]]:
        """The objects of a `{"<key>": [...]}` answer, decoded as they arrive: memory stays at
        one read block and one object, however long the answer."""
        with self._open(path, params) as (url, response):
            yield from _array_items(response, url, key)

    @contextlib.contextmanager
    def _open(
        self, path: str, params: Mapping[str, str] | None, method: str = "GET"
    ) -> Iterator[tuple[str, http.client.HTTPResponse]]:
        url = self.base_url + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        request = urllib.request.Request(url, headers=self._headers, method=method,
                                         data=b"" if method == "POST" else None)
        try:
            response = urllib.request.urlopen(request, timeout=self.timeout, context=self._tls)
        except urllib.error.HTTPError as err:
            if err.code == 401:
                given = "the token given was refused" if self._headers else "no token was given"
                raise AdminError(
                    f"{self.base_url}: the admin API wants authentication ({given}): pass "
                    f"--token-file FILE or set ${TOKEN_ENV}", 401,
                ) from None
            raise AdminError(f"{url}: HTTP {err.code}: {_error_message(err)}", err.code) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise AdminError(
                f"cannot reach the Ballast admin API at {self.base_url}: {reason} "
                f"(is `ballast serve` running? point --server or ${SERVER_ENV} at it)"
            ) from None
        with response:
            yield url, response


READ_BLOCK = 64 * 1024
MAX_ITEM_CHARS = 1024 * 1024


def _array_items(response: Any, url: str, key: str) -> Iterator[dict[str, Any]]:
    """Incrementally decode `{"<key>": [obj, obj, ...]}` from `response`."""
    decoder = json.JSONDecoder()
    text = codecs.getincrementaldecoder("utf-8")()
    buf, pos, started, done = "", 0, False, False

    def more() -> bool:
        nonlocal buf, pos
        try:
            block = response.read(READ_BLOCK)
        except OSError as err:
            raise AdminError(f"{url}: the answer broke off: {err}") from None
        buf = buf[pos:] + text.decode(block, final=not block)
        pos = 0
        return bool(block)

    def not_ours() -> AdminError:
        return AdminError(f"{url}: the answer is not the JSON expected (is this a Ballast admin "
                          "API?)")

    while not done:
        if not started:
            opening = buf.find("[")
            if opening < 0:
                if len(buf) > 64 or not more():
                    raise not_ours()
                continue
            if json.loads(buf[:opening] + "0}") != {key: 0}:
                raise not_ours()
            pos, started = opening + 1, True
        while pos < len(buf) and buf[pos] in " \t\r\n,":
            pos += 1
        if pos < len(buf) and buf[pos] == "]":
            done = True
            continue
        try:
            item, end = decoder.raw_decode(buf, pos)
        except json.JSONDecodeError:
            if len(buf) - pos > MAX_ITEM_CHARS:
                raise AdminError(f"{url}: a record over {MAX_ITEM_CHARS:,} characters") from None
            if not more():
                raise not_ours() from None
            continue
        if not isinstance(item, dict):
            raise not_ours()
        pos = end
        yield item


def _error_message(err: urllib.error.HTTPError) -> str:
    """The server's error message, escaped for the terminal (commands print it)."""
    body = err.read()
    try:
        message = json.loads(body)["error"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        return escape(str(err.reason))
    return escape(str(message))


class ServerSource:
    """Decision records from a running server's `/decisions` (a `RecordSource`)."""

    def __init__(self, client: AdminClient) -> None:
        self.client = client

    def __str__(self) -> str:
        return f"{self.client}/decisions"

    def query(self, query: Query, after_seq: int = 0) -> list[Record]:
        return list(self.records(query, after_seq))

    def records(self, query: Query, after_seq: int = 0) -> Iterator[Record]:
        """The records, decoded as the server streams them (bounded memory)."""
        params = query.to_params()
        if after_seq:
            params["after"] = str(after_seq)
        return self.client.items("/decisions", params, "records")

    def follow(
        self, query: Query, after_seq: int, poll_s: float, stop: Callable[[], bool]
    ) -> Iterator[Record]:
        """New matching records with seq > after_seq, polled every `poll_s`, until `stop()`."""
        last = after_seq
        while not stop():
            for record in self.records(query, last):
                last = max(last, int(record["seq"]))
                yield record
            time.sleep(poll_s)
