"""What the admin port logs about a request that went wrong: one line, never a client's traceback.

aiohttp logs every request it cannot parse (a request line or header over 8,190 bytes, a broken
chunked body, a bad method) with `logger.exception`: a 700-byte traceback per request, which
an unauthenticated client turned into 2.27 MB/s of log with `GET /healthz?aaaa…`. The admin
API's server is given `RequestErrors` as its logger instead: a client's malformed request
(aiohttp's `HttpProcessingError`, answered 400) is one WARNING line — the peer and aiohttp's
reason, escaped (`security/terminal.py`) and cut to `MAX_REASON_CHARS` — on the logger
`control_plane.admin.requests`, whose lines pass a rate limit in bytes
(`lifecycle/log_rate_limit.py`). A handler's own failure (a bug: answered 500) keeps its
traceback, through the same budget.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

from control_plane.security.terminal import escape

LOGGER = "control_plane.admin.requests"
MAX_REASON_CHARS = 200


def reason(err: HttpProcessingError) -> str:
    """aiohttp's reason for refusing a request, escaped and cut short."""
    text = escape(f"{err.code} {err.message}".strip())
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS] + "…"


class RequestErrors(logging.LoggerAdapter[logging.Logger]):
    """The logger aiohttp's request handler is given (`RequestHandler(logger=…)`)."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger(LOGGER), {})

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        return msg, kwargs

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        err = kwargs.get("exc_info")
        if isinstance(err, HttpProcessingError):
            peer = args[0] if args else "?"
            self.logger.warning("admin API: bad request from %s: %s", peer, reason(err))
            return
        super().log(level, msg, *args, **kwargs)
