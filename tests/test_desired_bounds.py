"""The desired-state reader bounds what a file can make it do (issue 8): nesting depth, number
sizes, problem counts and lengths, and what kind of file it reads. Each is a clear problem, never
a traceback or a hang."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from control_plane.desired import DesiredStateError, load_desired, parse_desired
from control_plane.desired.errors import MAX_MESSAGE_CHARS, MAX_PROBLEMS
from control_plane.desired.yaml_nodes import MAX_DEPTH, flow_too_deep

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "desired.yaml"


def problems_of(text: str) -> list[str]:
    with pytest.raises(DesiredStateError) as error:
        parse_desired(text, "d.yaml")
    messages = [str(p) for p in error.value.problems]
    assert all(len(m) < MAX_MESSAGE_CHARS * 2 + 100 for m in messages)
    return messages


@pytest.mark.parametrize(
    "text",
    [
        "pops: " + "[" * 400 + "]" * 400,  # a few hundred levels: RecursionError before
        "pops: " + "{a: " * 300 + "1" + "}" * 300,
        "pops: " + "[" * 500_000,  # 8,000 levels took PyYAML's scanner 52 s
        "pops:\n" + "".join("  " * i + "k:\n" for i in range(1, 400)),  # block mappings
        "pops:\n" + "".join(" " * i + "-\n" for i in range(1, 400)),  # block lists
    ],
)
def test_deep_nesting_is_a_problem(text: str) -> None:
    started = time.process_time()
    assert any(f"nested more than {MAX_DEPTH} levels deep" in m for m in problems_of(text))
    assert time.process_time() - started < 1.5  # no quadratic scanner, no hang


def test_numbers_of_thousands_of_digits_are_a_problem() -> None:
    for number in ("9" * 5000, "1." + "9" * 5000, "-" + "7" * 100_000):
        text = EXAMPLE.read_text().replace("port_offset: 1}", f"port_offset: {number}}}")
        messages = problems_of(text)
        assert any(f"a number of {len(number):,} characters" in m for m in messages), messages


def test_brackets_in_strings_and_comments_are_not_nesting() -> None:
    deep = "[" * (MAX_DEPTH + 5)
    text = f"a: '{deep}'\nb: \"{deep}\\\" {deep}\"\n# {deep}\nc: x{deep}#{deep}\n"
    assert flow_too_deep(text) is None
    assert flow_too_deep("a: " + "[" * (MAX_DEPTH + 1)) == (1, 4 + MAX_DEPTH)
    load_desired(EXAMPLE)  # the real format is far from the bound


def test_problems_are_capped_and_clipped() -> None:
    text = "".join(f"k{i}: 1\n" for i in range(3_000)) + "z" * 1000 + ": 1\n"
    messages = problems_of(text)
    assert len(messages) == MAX_PROBLEMS + 1
    assert sum("more problems (the first 200 are listed)" in m for m in messages) == 1
    long_key = next(m for m in problems_of("z" * 1000 + ": 1\n") if "zzz" in m)
    assert "[1,0" in long_key or "characters]" in long_key


@pytest.mark.parametrize("kind", ["device", "fifo", "directory"])
def test_non_regular_files_are_refused_without_reading(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "desired.yaml"
    if kind == "device":
        path.symlink_to("/dev/zero")  # read without limit before
    elif kind == "fifo":
        os.mkfifo(path)  # would block opening it
    else:
        path.mkdir()
    started = time.monotonic()
    with pytest.raises(DesiredStateError, match="not a regular file"):
        load_desired(path)
    assert time.monotonic() - started < 1.0


def test_a_symlink_to_a_regular_file_is_fine(tmp_path: Path) -> None:
    path = tmp_path / "desired.yaml"
    path.symlink_to(EXAMPLE)
    assert load_desired(path).digest == load_desired(EXAMPLE).digest
