"""The admin API answers only requests whose `Host` names it: DNS rebinding's precondition.

A page on another site can make a browser on the operator's machine send requests to a name
the attacker's DNS points at 127.0.0.1; the browser then sends that name as `Host`. So a request
is answered only when its `Host` (port dropped) is an IP address literal (what probes and
`curl http://127.0.0.1:18001` send), `localhost`, or one of the names given with
`--admin-host` (a DNS name operators reach the API by); otherwise 421 with a JSON error saying
which option admits the name. In every mode — open, token, client certificates — since a
browser's cookie would be sent to a rebound name too.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_SHOWN = 64


def host_name(header: str) -> str:
    """The name in a Host header, port and IPv6 brackets dropped, lower-cased."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    name, _, port = header.rpartition(":")
    return name if name and port.isdigit() else header


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_check(names: Iterable[str]) -> Callable[[web.Request, Handler], Awaitable[
        web.StreamResponse]]:
    allowed = frozenset({"localhost", *(n.lower() for n in names)})

    @web.middleware
    async def check_host(request: web.Request, handler: Handler) -> web.StreamResponse:
        name = host_name(request.headers.get("Host", ""))
        if name in allowed or is_ip_literal(name):
            return await handler(request)
        shown = name[:MAX_SHOWN] + ("…" if len(name) > MAX_SHOWN else "")
        return web.json_response(
            {"error": f"Host {shown!r} is not a name of this admin API: use its address, "
                      "localhost, or a name given with ballast serve --admin-host NAME"},
            status=421)

    return check_host
