"""Stand-ins for the few commands of deploy/README.md's runbook that would change the shared test
machine itself, or that need what one machine lacks (sshd, systemd), for the multi-host test
(`tests/test_deploy_hosts.py`). Each runbook block runs in its host's network namespace with
these first on PATH:

- `systemctl`: starts, stops, restarts and reloads (SIGHUP) a unit from the host's
  `/etc/systemd/system` (the runbook copies the kit's there), or Debian's etcd and prometheus
  units (their ExecStart, as the packages ship them): ExecStart with `${VAR}`s from
  EnvironmentFile=/Environment=, as the unit's User= (mapped by `runbook.SERVICE_USERS`), in
  its own session, output in the host's `log/`, PID in `run/<unit>.pid` (and every PID ever
  started in `run/all`, which the test stops at the end). A `Type=oneshot` unit runs to its end
  and `start` returns its status, as systemd's does. `daemon-reload`, `enable` and timers have
  nothing to do here (a timer's schedule is systemd's own: not walked).
- `scp [OPTIONS] SRC... DEST` and `ssh [OPTIONS] HOST COMMAND`: a copy between the hosts'
  folders, a command run in HOST's namespace and folder; both refused (as sshd would) unless
  the calling host's `/root/.ssh/id_ed25519.pub` is in HOST's `/root/.ssh/authorized_keys`, so
  the runbook's SSH set-up is walked too. The workstation (outside the hosts) is the operator's
  own access.
- `useradd`, `apt-get`: nothing (the accounts and packages are the machine's, see
  `SERVICE_USERS`; `deploy/ensure-test-services.sh` installs the packages).
- `chown`, `install`: the real commands with the service users mapped.

Environment: BALLAST_E2E_ROOTS (the hosts' folders), BALLAST_E2E_HOST (this host),
BALLAST_E2E_VENV (the shared /opt/ballast), BALLAST_E2E_NETNS (the namespaces' name prefix),
BALLAST_E2E_BIN (these shims' folder), BALLAST_E2E_PYTHON.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from harness.eventually import eventually_blocking
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
    # the shims first, for a unit's own commands (the etcd snapshot script's scp)
    env = {"PATH": f"{os.environ['BALLAST_E2E_BIN']}:/usr/local/bin:/usr/bin:/bin",
           "LANG": "C.UTF-8",
           **{k: v for k, v in os.environ.items() if k.startswith("BALLAST_E2E_")}}
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


def _start(name: str) -> int:
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
        if unit.get("Type") == "oneshot":
            return subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=subprocess.STDOUT, cwd=unit.get("WorkingDirectory")
                                  or "/", timeout=120, check=False).returncode
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=unit.get("WorkingDirectory") or "/")
    (roots / host / "run" / f"{name}.pid").write_text(f"{proc.pid}\n")
    with open(roots / host / "run" / "all", "a") as every:
        every.write(f"{proc.pid}\n")
    return 0


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
        with contextlib.suppress(AssertionError):  # still alive: the next signal
            eventually_blocking(lambda: not alive(pid), wait, f"process {pid} ending")
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
    status = 0
    for unit in units:
        if unit.endswith(".timer"):
            continue  # systemd's clock: not walked
        if command == "reload":
            _reload(unit)
        if command in ("stop", "restart"):
            _stop(unit)
        if command in ("start", "restart", "enable"):
            status = status or _start(unit)
    return status


def _reload(name: str) -> None:
    roots, host, _ = _env()
    os.kill(int((roots / host / "run" / f"{name}.pid").read_text()), signal.SIGHUP)


# ssh and scp options that take a value (the next argument)
SSH_VALUE_OPTIONS = {"-o", "-i", "-P", "-p", "-F", "-J", "-l", "-S", "-c", "-E"}


def _operands(args: list[str]) -> list[str]:
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in SSH_VALUE_OPTIONS:
            skip = True
        elif not arg.startswith("-"):
            out.append(arg)
    return out


def _remote(spec: str) -> tuple[str | None, str]:
    """(host, path) of `[user@]host:path`; (None, spec) for a local path."""
    if ":" not in spec or spec.startswith("/"):
        return None, spec
    host, _, path = spec.partition(":")
    return host.rpartition("@")[2], path


def _authorized(to_host: str) -> bool:
    """Whether this host's key logs it in as root on `to_host`, as sshd would decide."""
    roots, here, _ = _env()
    if here == "workstation":
        return True
    try:
        key = (roots / here / "root/.ssh/id_ed25519.pub").read_text().strip()
        allowed = (roots / to_host / "root/.ssh/authorized_keys").read_text().splitlines()
    except OSError:
        return False
    if key in (line.strip() for line in allowed):
        return True
    print(f"root@{to_host}: Permission denied (publickey).", file=sys.stderr)
    return False


def _on_host(host: str, path: str) -> Path:
    """A path of `host` (relocated for whichever host, or as the runbook wrote it)."""
    roots = _env()[0]
    located = host_of(path, roots)
    inside = located[1] if located else path
    return roots / host / inside.lstrip("/")


def scp(args: list[str]) -> int:
    *sources, target = _operands(args)
    to_host, path = _remote(target)
    if to_host is not None and not _authorized(to_host):
        return 255
    destination = Path(target) if to_host is None else _on_host(to_host, path)
    for source in sources:
        from_host, source_path = _remote(source)
        if from_host is not None and not _authorized(from_host):
            return 255
        origin = Path(source_path) if from_host is None else _on_host(from_host, source_path)
        into = destination / origin.name if destination.is_dir() else destination
        shutil.copyfile(origin, into)
        os.chmod(into, os.stat(origin).st_mode & 0o777)
    return 0


def ssh(args: list[str]) -> int:
    host, *command = _operands(args)
    host = host.rpartition("@")[2]
    if not _authorized(host):
        return 255
    roots, here, _ = _env()
    # the command was relocated for the calling host: its paths are the target's own
    text = " ".join(command).replace(f"{roots / here}/", f"{roots / host}/")
    env = {**os.environ, "BALLAST_E2E_HOST": host, "HOME": str(roots / host / "root")}
    return subprocess.run(["ip", "netns", "exec", f"{os.environ['BALLAST_E2E_NETNS']}{host}",
                           "bash", "-c", text], env=env, cwd=roots / host / "root",
                          check=False, timeout=120).returncode


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
    if name == "ssh":
        return ssh(args)
    if name in ("useradd", "apt-get"):
        return 0
    if name in ("chown", "install"):
        return subprocess.run([f"/usr/bin/{name}", *_mapped(name, args)],
                              check=False).returncode
    return 127


if __name__ == "__main__":
    sys.exit(main())
