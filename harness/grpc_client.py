"""A proxyless gRPC client in a process of its own: `python -m harness.grpc_client TARGET POP
[--also TARGET]`.

grpcio's xDS client (C-core) lives in the process that dials an `xds:///` target: one per
process, built from `GRPC_XDS_BOOTSTRAP` once, so one process is one node of one PoP (two PoPs'
clients in one process would share a node). Tests and the demo run each client here, started
with its bootstrap in the environment, and drive it with one command per line on stdin; each
command answers one JSON line on stdout:

- `calls N [TARGET]`: N calls, one after the other (to TARGET, one of the process's targets;
  default the first); answers `{"by_origin": {...}, "errors": {...}}`;
- `rate R`: from now on R calls a second in the background (0 stops); answers `{"rate": R}`;
- `report`: what the background calls got since the last report, as for `calls`, and how many
  are still in flight;
- `quit`.

Every call carries `x-ballast-pop: POP` (the test origins count and fault by it) and a deadline.
With `--xds-credentials` the channel takes the TLS settings Ballast sends (gRFC A29), falling
back to plaintext where a service has none.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

import grpc
import grpc.experimental

from harness.grpc_origin import METHOD, POP_METADATA

DEADLINE_S = 2.0


class Client:
    def __init__(self, targets: list[str], pop: str, xds_credentials: bool) -> None:
        self.channels: dict[str, grpc.Channel] = {}
        for target in targets:
            if xds_credentials:
                credentials = grpc.xds_channel_credentials(
                    grpc.experimental.insecure_channel_credentials())
                self.channels[target] = grpc.secure_channel(target, credentials)
            else:
                self.channels[target] = grpc.insecure_channel(target)
        self.call = self.channels[targets[0]].unary_unary(METHOD)
        self.metadata = ((POP_METADATA, pop),)
        self.lock = threading.Lock()
        self.by_origin: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.in_flight = 0
        self.rate = 0.0
        self._wake = threading.Event()
        threading.Thread(target=self._background, daemon=True).start()

    def calls(self, count: int, target: str | None = None) -> dict[str, Any]:
        by_origin: Counter[str] = Counter()
        errors: Counter[str] = Counter()
        call = self.call if target is None else self.channels[target].unary_unary(METHOD)
        for _ in range(count):
            try:
                by_origin[call(b"", timeout=DEADLINE_S, metadata=self.metadata).decode()] += 1
            except grpc.RpcError as err:
                errors[err.code().name] += 1
        return {"by_origin": dict(by_origin), "errors": dict(errors)}

    def report(self) -> dict[str, Any]:
        with self.lock:
            answer = {"by_origin": dict(self.by_origin), "errors": dict(self.errors),
                      "in_flight": self.in_flight}
            self.by_origin.clear()
            self.errors.clear()
        return answer

    def set_rate(self, rate: float) -> dict[str, Any]:
        self.rate = max(0.0, rate)
        self._wake.set()
        return {"rate": self.rate}

    def _background(self) -> None:
        sent, started = 0, time.monotonic()
        while True:
            rate = self.rate
            if rate <= 0:
                self._wake.wait()
                self._wake.clear()
                sent, started = 0, time.monotonic()
                continue
            due = started + sent / rate
            delay = due - time.monotonic()
            if delay > 0:
                if self._wake.wait(delay):
                    self._wake.clear()
                    sent, started = 0, time.monotonic()
                continue
            sent += 1
            with self.lock:
                self.in_flight += 1
            future = self.call.future(b"", timeout=DEADLINE_S, metadata=self.metadata)
            future.add_done_callback(self._done)

    def _done(self, future: grpc.Future) -> None:
        with self.lock:
            self.in_flight -= 1
            try:
                self.by_origin[future.result().decode()] += 1
            except grpc.RpcError as err:
                self.errors[err.code().name] += 1


ROOT = Path(__file__).resolve().parents[1]
_names = itertools.count(1)


class GrpcClientProcess:
    """One client process of one PoP, with `bootstrap` written to `directory` (tests, demo)."""

    def __init__(self, bootstrap: dict[str, Any], target: str, pop: str, directory: Path,
                 *, xds_credentials: bool = False, also: tuple[str, ...] = (),
                 ready_s: float = 30.0) -> None:
        number = next(_names)
        path = directory / f"grpc-bootstrap-{pop}-{number}.json"
        path.write_text(json.dumps(bootstrap))
        self.log = directory / f"grpc-client-{pop}-{number}.log"
        env = {**os.environ, "GRPC_XDS_BOOTSTRAP": str(path),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                           os.environ.get("PYTHONPATH")]))}
        command = [sys.executable, "-m", "harness.grpc_client", target, pop]
        if xds_credentials:
            command.append("--xds-credentials")
        for other in also:
            command += ["--also", other]
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                env=env, cwd=ROOT, start_new_session=True)
        self._lines: queue.Queue[str] = queue.Queue()
        assert self.process.stdout is not None
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()
        self._answer(ready_s)

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put("")  # the process ended

    def _answer(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"gRPC client {self.process.pid} gave no answer in {timeout} s; "
                               f"its log: {self.log.read_text()[-2000:]}") from None
        if not line:
            raise RuntimeError(f"gRPC client {self.process.pid} ended; its log: "
                               f"{self.log.read_text()[-2000:]}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, command: str, timeout: float = 60.0) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._answer(timeout)

    def stop(self) -> None:
        """Quit, or be killed by PID after 5 s."""
        if self.process.poll() is None:
            try:
                assert self.process.stdin is not None
                self.process.stdin.write("quit\n")
                self.process.stdin.close()
                self.process.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("pop")
    parser.add_argument("--also", action="append", default=[], metavar="TARGET")
    parser.add_argument("--xds-credentials", action="store_true")
    args = parser.parse_args()
    client = Client([args.target, *args.also], args.pop, args.xds_credentials)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        verb, _, value = line.strip().partition(" ")
        if verb == "calls":
            count, _, target = value.partition(" ")
            answer = client.calls(int(count), target or None)
        elif verb == "rate":
            answer = client.set_rate(float(value))
        elif verb == "report":
            answer = client.report()
        elif verb == "quit":
            break
        else:
            answer = {"error": f"unknown command {verb!r}"}
        print(json.dumps(answer), flush=True)
    for channel in client.channels.values():
        channel.close()


if __name__ == "__main__":
    main()
