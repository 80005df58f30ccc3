"""deploy/README.md's runbook as data, for the multi-host test: the fenced blocks marked
```` ```sh runbook=STEP hosts=H1,H2 ````, and what makes them runnable on one test machine.

- `blocks()` parses them in document order: the test runs exactly these texts, so the runbook and
  the test cannot drift apart. A block marked `needs=systemd` talks to systemd itself (time
  sync, the journal): the test names it as not walked.
- `relocate()` moves the absolute paths a host owns (`/etc/ballast`, `/var/lib/etcd`, `/root`,
  ...) under that host's own folder, and `/opt/ballast` to the one virtualenv the hosts share:
  the text is otherwise unchanged. Any other absolute path the runbook names is the machine's
  own (`/usr/bin/etcd`, `/bin/kill`).
- `SERVICE_USERS` maps the runbook's service accounts to accounts this machine has: `ballast`
  and `envoy` become `nobody` (the shared machine gets no new users), `etcd` and `prometheus`
  are Debian's own. `tests/support/host_shims.py` applies it to `chown`, `install` and the
  units' `User=`, so the services really run unprivileged and read only what the runbook let
  them read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "deploy" / "README.md"
SHARED_VENV = "/opt/ballast"
HOST_PATHS = ("/etc/ballast", "/etc/envoy", "/etc/etcd", "/etc/prometheus", "/etc/default",
              "/etc/systemd/system", "/etc/hosts", "/etc/nftables.conf", "/var/lib/ballast",
              "/var/lib/etcd", "/var/lib/prometheus", "/var/backups", "/root")
SERVICE_USERS = {"ballast": ("nobody", "nogroup"), "envoy": ("nobody", "nogroup"),
                 "etcd": ("etcd", "etcd"), "prometheus": ("prometheus", "prometheus")}
_FENCE = re.compile(r"^```sh runbook=(?P<step>[\w-]+)(?: hosts=(?P<hosts>[\w,-]+))?"
                    r"(?: needs=(?P<needs>\w+))?\n(?P<text>.*?)^```$", re.MULTILINE | re.DOTALL)
_PATHS = re.compile(r"(?<![\w./])(" + "|".join(re.escape(p) for p in
                                                  (SHARED_VENV, *HOST_PATHS)) +
                    r")(?=[/\s'\";:)]|$)")


@dataclass(frozen=True)
class Block:
    step: str
    hosts: tuple[str, ...]  # ("all",) for every host; () for the site block
    text: str
    needs: str | None = None  # "systemd": not walked


def blocks(text: str | None = None) -> list[Block]:
    source = RUNBOOK.read_text() if text is None else text
    return [Block(m["step"], tuple((m["hosts"] or "").split(",")) if m["hosts"] else (),
                  m["text"], m["needs"]) for m in _FENCE.finditer(source)]


def relocate(text: str, roots: Path, host: str, venv: Path) -> str:
    """`text` with the paths `host` owns under `roots/host` and /opt/ballast at `venv`."""
    def moved(match: re.Match[str]) -> str:
        path = match[1]
        return str(venv) if path == SHARED_VENV else f"{roots / host}{path}"
    return _PATHS.sub(moved, text)


def host_of(path: str, roots: Path) -> tuple[str, str] | None:
    """(host, path inside it) of a relocated path, else None."""
    inside = Path(path).resolve()
    try:
        relative = inside.relative_to(roots.resolve())
    except ValueError:
        return None
    if not relative.parts:
        return None
    return relative.parts[0], "/" + "/".join(relative.parts[1:])
