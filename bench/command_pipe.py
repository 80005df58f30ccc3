"""A benchmark server in a process of its own, driven by one JSON command per stdin line and
answering one JSON line on stdout: the client's side (`ServerProcess`) and the server's
(`commands`, `reply`). The server's first line is `{"port": ...}`; `{"cmd": "stop"}` ends it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from typing import Any

from bench.common import ROOT, proc_cpu_seconds, proc_rss_bytes


class ServerProcess:
    """`args` started in its own session (stopped by its PID only), its port read."""

    def __init__(self, args: list[str], *, stop_wait_s: float = 10.0) -> None:
        self.proc = subprocess.Popen(
            args, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self.stop_wait_s = stop_wait_s
        self.port = int(self._read()["port"])

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"benchmark server exited ({self.proc.poll()})")
        return dict(json.loads(line))

    async def call(self, **command: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return await asyncio.to_thread(self._read)

    def cpu(self) -> float:
        return proc_cpu_seconds(self.pid)

    def rss(self) -> int:
        return proc_rss_bytes(self.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.write('{"cmd": "stop"}\n')
                self.proc.stdin.flush()
            try:
                self.proc.wait(self.stop_wait_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def commands(port: int) -> AsyncIterator[dict[str, Any]]:
    """The server's side: says `port`, then yields each command until `stop` or stdin ends (read
    on a thread, so the event loop never blocks on it)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    def read_stdin() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(queue.put_nowait, json.loads(line))
        loop.call_soon_threadsafe(queue.put_nowait, None)

    threading.Thread(target=read_stdin, daemon=True).start()
    reply({"port": port})
    while (command := await queue.get()) is not None and command["cmd"] != "stop":
        yield command


def reply(data: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()
