"""An asyncio server out of descriptors (`lifecycle/accept_errors.py`): one log line when accepts
start failing, then a summary per interval — not a traceback per connection waiting. Run in a
process of its own whose descriptor limit is 64 and whose table is full; the control is the same
process with asyncio's default handler."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from harness.eventually import eventually_blocking

ROOT = Path(__file__).resolve().parents[1]
SERVER = """
import asyncio, logging, resource, sys
from control_plane.lifecycle.accept_errors import QuietAcceptErrors
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
async def main():
    if sys.argv[1] == "quiet":
        QuietAcceptErrors(every_s=1.0).install(asyncio.get_running_loop())
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    hog = []
    try:
        while True:
            hog.append(open("/dev/null"))
    except OSError:
        pass
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""
CLIENTS = 90  # within the listening socket's backlog (100): every one waits
RUN_S = 3.5


def _flood(handler: str) -> str:
    """The server's log after CLIENTS connections waited RUN_S seconds for it to accept."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER, handler], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    clients = []
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        for _ in range(CLIENTS):
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        started = time.monotonic()
        eventually_blocking(lambda: time.monotonic() - started >= RUN_S, RUN_S + 1,
                            "the flood's run", interval=0.1)
    finally:
        for client in clients:
            client.close()
        proc.kill()
        _, err = proc.communicate(timeout=10)
    return err


def test_accepts_out_of_descriptors_make_a_line_per_interval() -> None:
    log = _flood("quiet")
    lines = [line for line in log.splitlines() if "accept_errors" in line]
    assert "Traceback" not in log, log[-2000:]
    assert lines and "accepting connections failed: Too many open files" in lines[0], log
    # one line, then a summary a second (the interval here) while it goes on
    assert 2 <= len(lines) <= 1 + RUN_S + 1, lines
    assert "times in the last 1 s" in lines[1]
    print("\n".join(lines))


def test_control_asyncios_default_handler_logs_a_traceback_per_attempt() -> None:
    log = _flood("default")
    assert log.count("Traceback") >= 50, log[-2000:]
