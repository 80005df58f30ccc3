"""No function of the package or the harness is over `LIMIT` lines without a reason written
beside it (`ALLOWED`): a function that long holds several concerns, and a reader has to keep
all of them in mind at once (issue 38 split the ones it found, of up to 137 lines).

The tests and the benches are left out: a scenario test or a bench run reads as one story from
its set-up to its assertions or its report.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("control_plane", "harness")
LIMIT = 80  # lines, from the `def` to the function's last line
# "path:function" -> why it is longer
ALLOWED: dict[str, str] = {}


def long_functions(path: Path, root: Path = ROOT) -> list[tuple[str, int]]:
    """The functions of `path` over `LIMIT` lines: ("path under root:name", lines)."""
    where = path.relative_to(root).as_posix()
    return [(f"{where}:{node.name}", node.end_lineno - node.lineno + 1)
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > LIMIT]


def test_no_function_is_over_the_limit_without_a_reason() -> None:
    found = [(name, lines) for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))
             for name, lines in long_functions(path)]
    unexplained = [f"{name} ({lines} lines)" for name, lines in found if name not in ALLOWED]
    assert unexplained == [], f"over {LIMIT} lines: split it, or say why in ALLOWED: " + (
        ", ".join(unexplained))
    still = {name for name, _ in found}
    assert set(ALLOWED) <= still, f"no longer over {LIMIT} lines, drop from ALLOWED: " + (
        ", ".join(sorted(set(ALLOWED) - still)))


def test_the_count_sees_a_long_function(tmp_path: Path) -> None:
    """The control: a made-up function of `LIMIT` + 1 lines is found, one of `LIMIT` is not."""
    body = "\n".join(f"    x{n} = {n}" for n in range(LIMIT - 1))
    long, short = tmp_path / "long.py", tmp_path / "short.py"
    long.write_text(f"def f():\n{body}\n    return x0\n")
    short.write_text(f"def f():\n{body}\n")
    assert long_functions(long, tmp_path) == [("long.py:f", LIMIT + 1)]
    assert long_functions(short, tmp_path) == []
