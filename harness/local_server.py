"""Start a real server of the test-suite (Prometheus, etcd) in its own session and wait for it."""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from harness.eventually import eventually_blocking


def start_server(
    name: str, argv: Sequence[str], log_path: Path, ready_url: str,
    ready: Callable[[bytes], bool] = lambda _: True, timeout: float = 15.0,
) -> subprocess.Popen[bytes]:
    """`argv` started with its output in `log_path`, returned once `ready_url` answers 200 and
    `ready(body)` holds; RuntimeError if it exits first, TimeoutError (after stopping it) if it
    is not ready in time. Either message ends with the log's tail."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    def answers() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited: {log_tail(log_path)}")
        with urllib.request.urlopen(ready_url, timeout=1) as response:
            return response.status == 200 and ready(response.read())

    try:
        eventually_blocking(answers, timeout, f"{name} ready", interval=0.1,
                            ignore=(OSError, urllib.error.URLError))
    except AssertionError:
        proc.kill()
        proc.wait()
        raise TimeoutError(f"{name} not ready: {log_tail(log_path)}") from None
    return proc


def log_tail(path: Path, lines: int = 20) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])
