"""`ballast init DIR`: the deploy kit the wheel carries, written out (issue 37). What it writes is
the repository's own files (the units, the example desired state, the alert rules), with the
script executable; a file the operator changed is left alone unless --force."""

from __future__ import annotations

import os
from pathlib import Path

from control_plane.cli.init import KIT
from control_plane.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {name: ROOT / "control_plane/kit" / name for name in KIT} | {
    "ballast-alerts.yaml": ROOT / "deploy/prometheus/ballast-alerts.yaml",
    "desired.yaml": ROOT / "examples/desired.yaml",
}


def test_init_writes_the_kit(tmp_path: Path, capsys) -> None:
    kit = tmp_path / "kit"
    assert main(["init", str(kit)]) == 0
    assert sorted(p.name for p in kit.iterdir()) == sorted(KIT)
    for name, source in SOURCES.items():
        assert (kit / name).read_bytes() == source.read_bytes(), name
    assert os.access(kit / "etcd-snapshot.sh", os.X_OK)
    assert (kit / "ballast-replica.service").stat().st_mode & 0o777 == 0o644
    out = capsys.readouterr().out
    assert f"wrote {kit / 'ballast-replica.service'}" in out
    assert "a replica of three" in out
    # again: nothing differs, nothing to do
    assert main(["init", str(kit)]) == 0
    assert f"unchanged {kit / 'desired.yaml'}" in capsys.readouterr().out


def test_init_leaves_a_changed_file_alone_unless_forced(tmp_path: Path, capsys) -> None:
    assert main(["init", str(tmp_path)]) == 0
    edited = tmp_path / "desired.yaml"
    edited.write_text("# my site\n")
    (tmp_path / "envoy.service").unlink()
    capsys.readouterr()
    assert main(["init", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"{edited} exists and differs" in err and "nothing written" in err
    assert edited.read_text() == "# my site\n"
    assert not (tmp_path / "envoy.service").exists()  # all or nothing
    assert main(["init", str(tmp_path), "--force"]) == 0
    assert f"replaced {edited}" in capsys.readouterr().out
    assert edited.read_bytes() == SOURCES["desired.yaml"].read_bytes()
    assert (tmp_path / "envoy.service").exists()
