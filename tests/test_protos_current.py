"""The committed Python generated from protos/ is what `control_plane.gen.build` produces now."""

from __future__ import annotations

from control_plane.gen import build


def test_generated_protos_are_current(capsys) -> None:
    assert build.main(["--check"]) == 0, capsys.readouterr().out
