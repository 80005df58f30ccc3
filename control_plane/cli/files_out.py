"""Files a command writes for the operator (`ballast init`, `ballast prometheus-config`): all or
none, never over a file that holds something else unless asked.

Every target is checked before anything is written: a file already there with the same bytes is
left as it is, one with other bytes is refused (the operator may have edited it) unless
`force`. Each file is written atomically (a temporary file renamed over it), so a reader (systemd,
Prometheus) never sees half of one.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from control_plane.security.cert_dir import write_atomic


@dataclass(frozen=True)
class OutFile:
    path: Path
    data: bytes
    mode: int = 0o644


def write_files(command: str, files: list[OutFile], *, force: bool) -> int:
    """Write `files`; 0 when done (or nothing to do), 1 when refused or failed, after saying so
    on stderr (`command` names the command in its messages)."""
    try:
        differing = [f.path for f in files if f.path.exists() and f.path.read_bytes() != f.data]
    except OSError as err:
        print(f"{command}: {err}", file=sys.stderr)
        return 1
    if differing and not force:
        for path in differing:
            print(f"{command}: {path} exists and differs from what would be written",
                  file=sys.stderr)
        print(f"{command}: nothing written; --force replaces "
              f"{'it' if len(differing) == 1 else 'them'}", file=sys.stderr)
        return 1
    try:
        for out in files:
            if out.path.exists() and out.path.read_bytes() == out.data:
                print(f"unchanged {out.path}")
                continue
            write_atomic(out.path, out.data, out.mode)
            print(f"{'replaced' if out.path in differing else 'wrote'} {out.path}")
    except OSError as err:
        print(f"{command}: {err}", file=sys.stderr)
        return 1
    return 0
