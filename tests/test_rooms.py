"""The rooms import only as the README's room table allows.

Each row of the table under "## Architecture" names its rooms (`control_plane/<room>/`) and,
in "never does", the rooms it must not import ("importing `a/`, `b/`", or "importing any other
room"). Every import of every module under control_plane/ (at any depth, inside functions too)
is checked against those rows, and every room on disk must have a row.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "control_plane"
ROW = re.compile(r"^\| (`control_plane/[a-z_]+/`(?:, `[^`]+`)*) \|")
ROOM = re.compile(r"`control_plane/([a-z_]+)/`")


def room_table() -> dict[str, set[str] | None]:
    """Room -> the rooms it must not import (None: any other room)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Architecture"):]
    forbidden: dict[str, set[str] | None] = {}
    for line in section.splitlines():
        match = ROW.match(line)
        if match is None:
            continue
        never = line.rstrip(" |").rsplit(" | ", 1)[-1]
        rule: set[str] | None = set()
        if "importing any other room" in never:
            rule = None
        elif "importing" in never:
            rule = set(re.findall(r"`([a-z_]+)/`", never.split("importing", 1)[1]))
        for room in ROOM.findall(match.group(1)):
            forbidden[room] = rule
    return forbidden


def imports_by_room(package: Path) -> dict[str, set[tuple[str, str]]]:
    """Room -> (module file, room it imports) for every import of another room."""
    edges: dict[str, set[tuple[str, str]]] = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).parts
        if len(parts) < 2:
            continue  # control_plane/__main__.py: the entry point, not a room
        room = parts[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                dotted = name.split(".")
                if dotted[0] == "control_plane" and len(dotted) > 1 and dotted[1] != room:
                    edges.setdefault(room, set()).add(
                        (str(path.relative_to(package.parent)), dotted[1]))
    return edges


def violations(
    table: dict[str, set[str] | None], edges: dict[str, set[tuple[str, str]]]
) -> list[str]:
    return sorted(
        f"{module} imports control_plane.{target} ({room}/ must not)"
        for room, found in edges.items()
        for module, target in found
        if (rule := table.get(room, set())) is None or target in rule
    )


def test_every_room_has_a_row_in_the_table() -> None:
    rooms = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert rooms - set(room_table()) == set(), "rooms missing from README's room table"


def test_the_table_reads_as_expected() -> None:
    table = room_table()
    assert table["desired"] is None
    assert table["ads"] is not None and {"app", "admin", "decide"} <= table["ads"]
    assert table["translate"] is not None and "decide" in table["translate"]
    assert table["decide"] is not None and {"ads", "observe", "intent", "app"} <= table["decide"]


def test_no_room_imports_what_its_row_forbids() -> None:
    assert violations(room_table(), imports_by_room(PACKAGE)) == []


def test_forbidden_edges_are_caught_at_any_depth(tmp_path: Path) -> None:
    """The same check on a made-up tree with three forbidden edges and two allowed ones."""
    package = tmp_path / "control_plane"
    files = {
        "ads/stream.py": "def f():\n    from control_plane.app.service import BallastService\n",
        "ads/deep/core.py": "import control_plane.decide.controller\n",
        "ads/ok.py": "from control_plane.translate import translate_pop\n",
        "desired/model.py": "from control_plane.gen import build\n",
        "app/any.py": "from control_plane.ads.server import AdsServicer\n",
    }
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    assert violations(room_table(), imports_by_room(package)) == [
        "control_plane/ads/deep/core.py imports control_plane.decide (ads/ must not)",
        "control_plane/ads/stream.py imports control_plane.app (ads/ must not)",
        "control_plane/desired/model.py imports control_plane.gen (desired/ must not)",
    ]


# Outside the package: who may import whom among the top-level folders (README, "Architecture").
TOP_LEVEL_FORBIDDEN = {
    "control_plane": {"harness", "tests", "bench"},
    "harness": {"tests", "bench"},
    "tests": {"bench"},
    "bench": {"tests"},
}


def top_level_imports(folder: Path) -> set[tuple[str, str]]:
    """(module file, top-level package it imports) for every absolute import under `folder`."""
    found: set[tuple[str, str]] = set()
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.add((str(path.relative_to(folder.parent)), name.split(".")[0]))
    return found


def test_the_harness_stays_out_of_the_package_and_tests_and_bench_stay_apart() -> None:
    crossings = sorted(
        f"{module} imports {target}"
        for folder, forbidden in TOP_LEVEL_FORBIDDEN.items()
        for module, target in top_level_imports(ROOT / folder)
        if target in forbidden
    )
    assert crossings == []
    assert ("harness/fleet.py", "control_plane") in top_level_imports(ROOT / "harness")
