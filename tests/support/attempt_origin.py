"""The origin process of `attempt_fleet.AttemptOrigin`: `python -m tests.support.attempt_origin
'<json config>'` serves on 127.0.0.1:<port> until terminated, appending one JSON line per
attempt (origin, tier, attempt number, status, its own service time in ms) to the log file."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import sys
import time
from typing import Any

from aiohttp import web


def app(config: dict[str, Any]) -> web.Application:
    answers = itertools.cycle(config["answer_ms"])
    rate = float(config["fail_rate"])
    served = itertools.count(1)
    log = open(config["log"], "a", buffering=1)  # noqa: SIM115 - open for the process' life

    async def handle(request: web.Request) -> web.Response:
        started = time.perf_counter()
        n = next(served)
        fail = math.floor(n * rate) > math.floor((n - 1) * rate)
        await asyncio.sleep((config["fail_ms"] if fail else next(answers)) / 1000)
        status = 503 if fail else 200
        log.write(json.dumps({
            "origin": config["name"], "tier": request.headers.get("x-ballast-tier", ""),
            "number": int(request.headers.get("x-envoy-attempt-count") or 1),
            "status": status, "served_ms": (time.perf_counter() - started) * 1000,
        }) + "\n")
        return web.Response(status=status, text=f"{config['name']}\n")

    application = web.Application()
    application.router.add_route("*", "/{tail:.*}", handle)
    return application


if __name__ == "__main__":
    settings = json.loads(sys.argv[1])
    web.run_app(app(settings), host="127.0.0.1", port=settings["port"], print=None,
                access_log=None)
