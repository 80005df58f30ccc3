"""Every wait for a condition in the tests, the harness and the bench goes through
`harness/eventually.py`: a loop of their own that polls until something holds or a deadline
passes is found here.

What counts as a hand-written wait: a `while` loop that reads a clock in its condition (or
asserts on one in its body) and ends on something else too (another operand of its condition, a
`break` or a `return`), and a `for` loop that sleeps and breaks or returns. A loop that runs for
a given time and stops only then (traffic for N seconds, a flood, a measurement window) is the
time itself as the subject: it passes.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("tests", "harness", "bench")
HELPER = ROOT / "harness" / "eventually.py"
CLOCKS = {"monotonic", "time", "perf_counter"}
# (module, function) -> why its loop is no wait for a condition
ALLOWED = {
    "harness/hedging.py:_closed_within": "an origin stalling its answer, cut short when Envoy "
    "resets the attempt: the stall is the subject (a socket's select, not a poll)",
    "bench/common.py:time_per_call": "a measurement calibrated to last at least its minimum "
    "time: the time is the subject",
}


def _reads_clock(node: ast.AST) -> bool:
    return any(isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
               and call.func.attr in CLOCKS for call in ast.walk(node))


def _sleeps(node: ast.AST) -> bool:
    return any(isinstance(call, ast.Call) and (
        (isinstance(call.func, ast.Attribute) and call.func.attr == "sleep")
        or (isinstance(call.func, ast.Name) and call.func.id == "sleep"))
        for call in ast.walk(node))


def _body(loop: ast.While | ast.For) -> list[ast.AST]:
    """The loop's own statements and expressions (not those of a nested loop or function)."""
    nodes, stack = [], list(loop.body)
    while stack:
        node = stack.pop()
        nodes.append(node)
        if not isinstance(node, ast.While | ast.For | ast.FunctionDef | ast.AsyncFunctionDef
                          | ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))
    return nodes


def hand_written_waits(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    for function in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if f"{path.relative_to(root)}:{function.name}" in ALLOWED:
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.While):
                body = _body(node)
                exits = any(isinstance(n, ast.Break | ast.Return) for n in body)
                clocked = _reads_clock(node.test) or any(
                    isinstance(n, ast.Assert | ast.If) and _reads_clock(n.test) for n in body)
                other = isinstance(node.test, ast.BoolOp) or not _reads_clock(node.test)
                if clocked and (other or exits):
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
            elif (isinstance(node, ast.For) and isinstance(node.target, ast.Name)
                  and node.target.id == "_" and _sleeps(node)
                  and any(isinstance(n, ast.Break | ast.Return) for n in _body(node))):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return sorted(set(found), key=lambda where: int(where.rsplit(":", 1)[1]))


def test_no_wait_is_written_by_hand() -> None:
    found = [where for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))
             if path != HELPER for where in hand_written_waits(path)]
    assert found == [], "wait through harness/eventually.py instead: " + ", ".join(found)


def test_the_check_finds_the_shapes_of_a_hand_written_wait(tmp_path: Path) -> None:
    module = tmp_path / "waits.py"
    module.write_text(
        "import time\n"
        "def a(ok):\n"
        "    deadline = time.monotonic() + 5\n"
        "    while not ok() and time.monotonic() < deadline:\n"
        "        time.sleep(0.1)\n"
        "def b(ok):\n"
        "    deadline = time.monotonic() + 5\n"
        "    while time.monotonic() < deadline:\n"
        "        if ok():\n"
        "            return\n"
        "def c(ok):\n"
        "    for _ in range(50):\n"
        "        if ok():\n"
        "            break\n"
        "        time.sleep(0.1)\n"
        "def d(ok):\n"
        "    deadline = time.monotonic() + 5\n"
        "    while True:\n"
        "        if ok():\n"
        "            return\n"
        "        if time.monotonic() > deadline:\n"
        "            raise TimeoutError\n"
        "def traffic(send):\n"  # the time as the subject: passes
        "    ends = time.monotonic() + 5\n"
        "    while time.monotonic() < ends:\n"
        "        send()\n"
        "def pushes(push):\n"  # a loop of work that stops at a failure: passes
        "    for n in range(10):\n"
        "        if not push(n):\n"
        "            break\n"
        "        time.sleep(0.05)\n")
    found = hand_written_waits(module, tmp_path)
    assert [where.rsplit(":", 1)[1] for where in found] == ["4", "8", "12", "18"]
