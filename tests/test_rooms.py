"""The rooms import only as `docs/rooms.toml` allows, and the pure rooms touch no clock, file or
network.

`docs/rooms.toml` names every room of control_plane/ with the rooms it must not import (or "any
other room"), which rooms are pure, what a pure room never imports, and which top-level folders
never import which. Every import of every module (at any depth, inside functions too) is checked
against it. docs/architecture.md shows the same data as tables, and its room table ("What each
room holds") says the same in words: both are checked against the file.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "control_plane"
RULES = ROOT / "docs" / "rooms.toml"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
ROW = re.compile(r"^\| (`control_plane/[a-z_]+/`(?:, `[^`]+`)*) \|")
ROOM = re.compile(r"`control_plane/([a-z_]+)/`")


def rules() -> dict[str, Any]:
    return tomllib.loads(RULES.read_text())


def forbidden_rooms(data: dict[str, Any]) -> dict[str, set[str] | None]:
    """Room -> the rooms it must not import (None: any other room)."""
    return {room: None if row["must_not_import"] == "any" else set(row["must_not_import"])
            for room, row in data["rooms"].items()}


def room_table_in_words() -> dict[str, set[str] | None]:
    """The same, as docs/architecture.md's room table says it ("never does": "importing `a/`,
    `b/`", or "importing any other room")."""
    text = ARCHITECTURE.read_text()
    start = text.index("## What each room holds")
    section = text[start:text.index("\n## ", start + 1)]
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


def rooms_markdown(data: dict[str, Any]) -> str:
    """The tables docs/architecture.md shows, made from the data."""
    lines = ["| room | pure | never imports |", "|---|---|---|"]
    for room, row in data["rooms"].items():
        never = row["must_not_import"]
        shown = ("any other room" if never == "any"
                 else ", ".join(f"`{r}/`" for r in never) or "(no rule)")
        lines.append(f"| `control_plane/{room}/` | {'yes' if row['pure'] else 'no'} | {shown} |")
    lines += ["", "| folder | never imports |", "|---|---|"]
    lines += [f"| `{folder}/` | {', '.join(f'`{t}/`' for t in never)} |"
              for folder, never in data["top_level"].items()]
    pure = data["pure"]
    lines += ["", "A pure room never imports "
              + ", ".join(f"`{m}`" for m in pure["forbidden_modules"])
              + ", nor calls " + ", ".join(f"`{b}()`" for b in pure["forbidden_builtins"])
              + "; the one exception is "
              + ", ".join(f"`{a}`" for a in pure["io_adapters"]) + "."]
    return "\n".join(lines)


def _imported_names(tree: ast.AST) -> list[tuple[str, int]]:
    """(dotted module, line) of every absolute import in `tree`."""
    names: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append((node.module, node.lineno))
    return names


def imports_by_room(package: Path) -> dict[str, set[tuple[str, str]]]:
    """Room -> (module file, room it imports) for every import of another room."""
    edges: dict[str, set[tuple[str, str]]] = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).parts
        if len(parts) < 2:
            continue  # control_plane/__main__.py: the entry point, not a room
        room = parts[0]
        for name, _ in _imported_names(ast.parse(path.read_text(), str(path))):
            dotted = name.split(".")
            if dotted[0] == "control_plane" and len(dotted) > 1 and dotted[1] != room:
                edges.setdefault(room, set()).add(
                    (str(path.relative_to(package.parent)), dotted[1]))
    return edges


def module_imports(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same room it imports, at any depth (type-only imports under
    `if TYPE_CHECKING:` included): `from control_plane.a import b` is the module `a.b` when
    there is one, else the package `a`."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    found: dict[str, set[str]] = {}
    for module, path in modules.items():
        room = module.split(".")[:2]
        named: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                named |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                named |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in
                          modules else node.module for alias in node.names}
        found[module] = {name for name in named
                         if name in modules and name != module and name.split(".")[:2] == room}
    return found


def module_circles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The circles of imports: each list holds the modules that reach one another."""
    circles: list[list[str]] = []
    for module in sorted(imports):
        circle = sorted(m for m in _reached(imports, module) if module in _reached(imports, m))
        if len(circle) > 1 and circle not in circles:
            circles.append(circle)
    return circles


def _reached(imports: dict[str, set[str]], start: str) -> set[str]:
    """`start` and every module it imports, directly or through others."""
    reach, todo = {start}, [start]
    while todo:
        for module in imports[todo.pop()] - reach:
            reach.add(module)
            todo.append(module)
    return reach


def violations(
    table: dict[str, set[str] | None], edges: dict[str, set[tuple[str, str]]]
) -> list[str]:
    return sorted(
        f"{module} imports control_plane.{target} ({room}/ must not)"
        for room, found in edges.items()
        for module, target in found
        if (rule := table.get(room, set())) is None or target in rule
    )


def impurities(package: Path, data: dict[str, Any]) -> list[str]:
    """Imports of clock, file, network, thread or process modules, and calls of `open()`-like
    builtins, in the pure rooms' modules (but the listed I/O adapters)."""
    pure = data["pure"]
    banned, builtins = set(pure["forbidden_modules"]), set(pure["forbidden_builtins"])
    found: list[str] = []
    for room, row in data["rooms"].items():
        if not row["pure"]:
            continue
        for path in sorted((package / room).rglob("*.py")):
            module = str(path.relative_to(package.parent))
            if module in pure["io_adapters"]:
                continue
            tree = ast.parse(path.read_text(), str(path))
            found += [f"{module}:{line} imports {name}"
                      for name, line in _imported_names(tree) if name.split(".")[0] in banned]
            found += [f"{module}:{node.lineno} calls {node.func.id}()"
                      for node in ast.walk(tree)
                      if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                      and node.func.id in builtins]
    return sorted(found)


def top_level_imports(folder: Path) -> set[tuple[str, str]]:
    """(module file, top-level package it imports) for every absolute import under `folder`."""
    return {(str(path.relative_to(folder.parent)), name.split(".")[0])
            for path in sorted(folder.rglob("*.py"))
            for name, _ in _imported_names(ast.parse(path.read_text(), str(path)))}


def test_every_room_on_disk_has_rules_and_a_row_in_words() -> None:
    rooms = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert rooms == set(rules()["rooms"]), "docs/rooms.toml and control_plane/ differ"
    assert rooms - set(room_table_in_words()) == set(), (
        "rooms missing from docs/architecture.md's room table")


def test_the_architecture_doc_shows_the_rules_of_the_data() -> None:
    data = rules()
    assert room_table_in_words() == forbidden_rooms(data)
    expected = rooms_markdown(data)
    assert expected in ARCHITECTURE.read_text(), (
        "docs/architecture.md does not show docs/rooms.toml; its tables should read:\n" + expected)


def test_the_rules_read_as_expected() -> None:
    table = forbidden_rooms(rules())
    assert table["desired"] is None
    assert table["ads"] is not None and {"lifecycle", "admin", "decide"} <= table["ads"]
    assert table["translate"] is not None and "decide" in table["translate"]
    assert table["decide"] is not None and {"ads", "observe", "intent", "lifecycle"} <= table[
        "decide"]
    assert table["replicas"] is not None and {"reload", "rollout", "xds_port"} <= table["replicas"]
    assert {room for room, row in rules()["rooms"].items() if row["pure"]} == {
        "desired", "translate", "decide"}


def test_no_room_imports_what_its_rules_forbid() -> None:
    assert violations(forbidden_rooms(rules()), imports_by_room(PACKAGE)) == []


def test_no_two_rooms_import_each_other_even_through_others() -> None:
    """The imports between rooms run one way: peeled off from the rooms that import no other
    room that is left, every room goes (a room that stays is on a circle)."""
    imports = {room: {target for _, target in found}
               for room, found in imports_by_room(PACKAGE).items()}
    left = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    while ground := {room for room in left if not imports.get(room, set()) & left}:
        left -= ground
    assert left == set(), f"rooms on a circle of imports: {sorted(left)}"


def test_no_two_modules_of_a_room_import_each_other_even_type_only() -> None:
    """Inside a room too the imports run one way: no module imports one that imports it back,
    directly or through others, not even for type hints only (a part that reads a few values
    of another gets them, or a protocol of them, handed in)."""
    assert module_circles(module_imports(PACKAGE)) == []


def test_the_pure_rooms_import_no_clock_file_or_network() -> None:
    assert impurities(PACKAGE, rules()) == []


def test_the_harness_stays_out_of_the_package_and_tests_and_bench_stay_apart() -> None:
    crossings = sorted(
        f"{module} imports {target}"
        for folder, forbidden in rules()["top_level"].items()
        for module, target in top_level_imports(ROOT / folder)
        if target in forbidden
    )
    assert crossings == []
    assert ("harness/fleet.py", "control_plane") in top_level_imports(ROOT / "harness")


def test_forbidden_edges_are_caught_at_any_depth(tmp_path: Path) -> None:
    """The same checks on a made-up tree: three forbidden edges and two allowed ones, three
    impurities of a pure room (one inside a function) next to an allowed adapter, and a circle
    of two modules of one room closed by a type-only import (beside a one-way chain)."""
    package = tmp_path / "control_plane"
    files = {
        "ads/stream.py": ("def f():\n"
                          "    from control_plane.lifecycle.service import BallastService\n"),
        "ads/deep/core.py": "import control_plane.decide.controller\n",
        "ads/ok.py": "from control_plane.translate import translate_pop\n",
        "desired/model.py": "from control_plane.gen import build\n",
        "desired/loader.py": "import os\n",
        "lifecycle/any.py": "from control_plane.ads.server import AdsServicer\n",
        "decide/clock.py": "import time\n\ndef f():\n    from urllib.request import urlopen\n",
        "translate/read.py": "def f(p):\n    return open(p).read()\n",
        "lifecycle/whole.py": "from control_plane.lifecycle.face import shown\n",
        "lifecycle/face.py": ("from typing import TYPE_CHECKING\n"
                              "from control_plane.lifecycle import hands\n"
                              "if TYPE_CHECKING:\n"
                              "    from control_plane.lifecycle.whole import Whole\n"),
        "lifecycle/hands.py": "from control_plane.lifecycle.any import f\n",
    }
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    data = rules()
    assert violations(forbidden_rooms(data), imports_by_room(package)) == [
        "control_plane/ads/deep/core.py imports control_plane.decide (ads/ must not)",
        "control_plane/ads/stream.py imports control_plane.lifecycle (ads/ must not)",
        "control_plane/desired/model.py imports control_plane.gen (desired/ must not)",
    ]
    assert impurities(package, data) == [
        "control_plane/decide/clock.py:1 imports time",
        "control_plane/decide/clock.py:4 imports urllib.request",
        "control_plane/translate/read.py:2 calls open()",
    ]
    assert module_circles(module_imports(package)) == [
        ["control_plane.lifecycle.face", "control_plane.lifecycle.whole"]]
