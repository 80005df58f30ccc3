"""How long an operator's probe waits for a server's event loop: `/healthz` asked from a thread
of another loop's process (or of a test), every 10 ms, each answer timed. A slow answer is the
loop busy (or starved of the GIL) for that long; the server's own work is not slowed by it."""

from __future__ import annotations

import threading
import time
import urllib.request


class HealthzProbe:
    """Each `/healthz` answer as (asked at `perf_counter()`, seconds it took)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            with urllib.request.urlopen(self.url, timeout=30) as answer:
                answer.read()
            self.answers.append((started, time.perf_counter() - started))
            self._stop.wait(0.01)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def worst(self, start: float = float("-inf"), end: float = float("inf")) -> float:
        """The longest answer that was under way at some time between `start` and `end` (0
        when none was)."""
        return max((took for asked, took in self.answers
                    if asked + took >= start and asked <= end), default=0.0)

    def during(self, start: float, end: float) -> int:
        """How many answers were asked between `start` and `end`."""
        return sum(start <= asked <= end for asked, _ in self.answers)
