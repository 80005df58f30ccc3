"""Hosts as network namespaces on one bridge, for the multi-host test.

Every name carries the test's PID (namespaces `ballast-<pid>-<host>`, bridge `bb<pid>`, veths
`bv<pid><i>`), so parallel runs never meet, and teardown removes exactly those names. Addresses
are from the benchmarking range 198.18.0.0/15; the bridge has no address and nothing routes
out, so no packet leaves the namespaces. `link(host, up=False)` takes a host off the bridge
(its veth down) as a partition does.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@dataclass(frozen=True)
class Host:
    name: str
    ns: str
    address: str
    veth: str  # the bridge's side

    def argv(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv]

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            timeout: float = 60, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(argv), env=None if env is None else dict(env),
                              capture_output=True, text=True, timeout=timeout, cwd=cwd)


class HostNetwork:
    def __init__(self, addresses: Mapping[str, str]) -> None:
        pid = os.getpid()
        self.bridge = f"bb{pid}"
        self.hosts = {name: Host(name, f"ballast-{pid}-{name}", address, f"bv{pid}{i}")
                      for i, (name, address) in enumerate(addresses.items())}
        self._made: list[str] = []

    def __enter__(self) -> HostNetwork:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._made.append(self.bridge)
            _ip("link", "set", self.bridge, "up")
            for host in self.hosts.values():
                _ip("netns", "add", host.ns)
                self._made.append(host.ns)
                _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0",
                    "netns", host.ns)
                self._made.append(host.veth)
                _ip("link", "set", host.veth, "master", self.bridge, "up")
                _ip("-n", host.ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
                _ip("-n", host.ns, "link", "set", "eth0", "up")
                _ip("-n", host.ns, "link", "set", "lo", "up")
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def link(self, host: str, *, up: bool) -> None:
        _ip("link", "set", self.hosts[host].veth, "up" if up else "down")

    def teardown(self) -> None:
        """Delete what was made, by name. A veth pair is deleted by itself first: a deleted
        namespace takes its veths along only once the kernel frees it, later, and a next
        network of the same process (the same names) would find them still there."""
        namespaces = {host.ns for host in self.hosts.values()}
        for name in reversed(self._made):
            kind = ["netns", "del", name] if name in namespaces else ["link", "del", name]
            subprocess.run(["ip", *kind], capture_output=True, timeout=30)
        self._made.clear()
