"""Stand-ins for the few commands of deploy/README.md's runbook that would change the shared test
machine itself, for the multi-host test (`tests/test_deploy_hosts.py`). Each runbook block runs
in its host's network namespace with these first on PATH:

- `systemctl`: starts, stops and restarts a unit from the host's `/etc/systemd/system` (the
  runbook copies ours there), or Debian's etcd and prometheus units (their ExecStart, as the
  packages ship them): ExecStart with `${VAR}`s from EnvironmentFile=/Environment=, as the
  unit's User= (mapped by `runbook.SERVICE_USERS`), in its own session, output in the host's
  `log/`, PID in `run/<unit>.pid` (and every PID ever started in `run/all`, which the test
  stops at the end). `daemon-reload` and `enable` have nothing to do here.
- `scp SRC... HOST:PATH`: a copy into that host's folder (one machine).
- `useradd`, `apt-get`: nothing (the accounts and packages are the machine's, see
  `SERVICE_USERS`; `deploy/ensure-test-services.sh` installs the packages).
- `chown`, `install`: the real commands with the service users mapped.

Environment: BALLAST_E2E_ROOTS (the hosts' folders), BALLAST_E2E_HOST (this host),
BALLAST_E2E_VENV (the shared /opt/ballast).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.runbook import SERVICE_USERS, host_of, relocate

DEBIAN_UNITS = {
    "etcd": "[Service]\nUser=etcd\nEnvironmentFile=-/etc/default/etcd\n"
            "ExecStart=/usr/bin/etcd\n",
    "prometheus": "[Service]\nUser=prometheus\n"
                  "ExecStart=/usr/bin/prometheus --config.file=/etc/prometheus/prometheus.yml "
                  "--storage.tsdb.path=/var/lib/prometheus/metrics2/\n",
}
STOP_TIMEOUT_S = 15.0


def _env() -> tuple[Path, str, Path]:
    return (Path(os.environ["BALLAST_E2E_ROOTS"]), os.environ["BALLAST_E2E_HOST"],
            Path(os.environ["BALLAST_E2E_VENV"]))


def _unit_text(name: str) -> str:
    roots, host, venv = _env()
    path = roots / host / "etc/systemd/system" / f"{name}.service"
    text = path.read_text() if path.exists() else DEBIAN_UNITS[name]
    return relocate(text, roots, host, venv)


def _unit(name: str) -> dict[str, str]:
    """The [Service] keys of a unit, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", _unit_text(name))
    keys: dict[str, str] = {}
    for line in joined.splitlines():
        key, eq, value = line.partition("=")
        if eq and not line.startswith("#"):
            keys[key.strip()] = value.strip() if key.strip() not in keys else \
                keys[key.strip()] + "\n" + value.strip()
    return keys


def _environment(unit: dict[str, str]) -> dict[str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    for line in unit.get("Environment", "").splitlines():
        key, _, value = line.partition("=")
        env[key] = value
    for line in unit.get("EnvironmentFile", "").splitlines():
        path = Path(line.removeprefix("-"))
        if not path.exists() and line.startswith("-"):
            continue
        for entry in path.read_text().splitlines():
            key, eq, value = entry.partition("=")
            if eq and not entry.startswith("#"):
                env[key.strip()] = value.strip()
    return env


def _start(name: str) -> None:
    roots, host, _ = _env()
    unit = _unit(name)
    env = _environment(unit)
    argv = [re.sub(r"\$\{(\w+)\}", lambda m: env.get(m[1], ""), word)
            for word in shlex.split(unit["ExecStart"])]
    user, group = SERVICE_USERS.get(unit.get("User", "root"), ("root", "root"))
    if user != "root":
        argv = ["setpriv", f"--reuid={user}", f"--regid={group}", "--clear-groups", "--", *argv]
    (roots / host / "log").mkdir(exist_ok=True)
    (roots / host / "run").mkdir(exist_ok=True)
    with open(roots / host / "log" / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=unit.get("WorkingDirectory") or "/")
    (roots / host / "run" / f"{name}.pid").write_text(f"{proc.pid}\n")
    with open(roots / host / "run" / "all", "a") as every:
        every.write(f"{proc.pid}\n")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def stop_pid(pid: int, timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM to the process group, SIGKILL after `timeout` (systemd's TimeoutStopSec)."""
    for signum, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, signum)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not alive(pid):
            return


def _stop(name: str) -> None:
    roots, host, _ = _env()
    pid_file = roots / host / "run" / f"{name}.pid"
    if pid_file.exists():
        stop_pid(int(pid_file.read_text()))
        pid_file.unlink()


def systemctl(args: list[str]) -> int:
    words = [a for a in args if not a.startswith("-")]
    if not words:
        return 2
    command, units = words[0], [u.removesuffix(".service") for u in words[1:]]
    if command == "daemon-reload" or (command == "enable" and "--now" not in args):
        return 0
    for unit in units:
        if command in ("stop", "restart"):
            _stop(unit)
        if command in ("start", "restart", "enable"):
            _start(unit)
    return 0


def scp(args: list[str]) -> int:
    roots = _env()[0]
    *sources, target = [a for a in args if not a.startswith("-")]
    to_host, colon, path = target.partition(":")
    if not colon:
        return 2
    located = host_of(path, roots)
    inside = located[1] if located else path
    destination = roots / to_host / inside.lstrip("/")
    if path.endswith("/"):
        destination = Path(f"{destination}/")
    for source in sources:
        into = destination / Path(source).name if destination.is_dir() else destination
        shutil.copyfile(source, into)
        os.chmod(into, os.stat(source).st_mode & 0o777)
    return 0


def _user(name: str) -> str:
    return SERVICE_USERS.get(name, (name, name))[0]


def _group(name: str) -> str:
    return SERVICE_USERS.get(name, (name, name))[1]


def _mapped(command: str, args: list[str]) -> list[str]:
    """`chown OWNER[:GROUP] ...` and `install -o USER -g GROUP ...` with the service users
    mapped."""
    out = list(args)
    if command == "chown":
        at = next(i for i, a in enumerate(out) if not a.startswith("-"))
        user, colon, group = out[at].partition(":")
        out[at] = f"{_user(user) if user else ''}{colon}{_group(group) if group else ''}"
        return out
    for i in range(1, len(out)):
        if out[i - 1] == "-o":
            out[i] = _user(out[i])
        elif out[i - 1] == "-g":
            out[i] = _group(out[i])
    return out


def main() -> int:
    name, args = sys.argv[1], sys.argv[2:]
    if name == "systemctl":
        return systemctl(args)
    if name == "scp":
        return scp(args)
    if name in ("useradd", "apt-get"):
        return 0
    if name in ("chown", "install"):
        return subprocess.run([f"/usr/bin/{name}", *_mapped(name, args)],
                              check=False).returncode
    return 127


if __name__ == "__main__":
    sys.exit(main())
