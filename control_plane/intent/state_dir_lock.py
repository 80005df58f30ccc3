"""One running server per state directory.

Two servers writing the same weights and decision log would interleave sequence numbers and
undo each other's decisions. `ballast serve` takes an exclusive `flock` on `<state dir>/lock`
for its whole life; the kernel drops it when the process dies, even by `kill -9`, so a restart
never finds a stale lock. Readers (`ballast decisions`, `explain`) do not take it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = "lock"


class StateDirBusy(Exception):
    """Another live process serves from this state directory."""


class StateDirLock:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_FILE
        self._fd = -1

    def acquire(self) -> StateDirLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise StateDirBusy(
                f"{self.path.parent}: already in use by pid {holder}; one server per state "
                "directory"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = -1
