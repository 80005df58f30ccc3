"""The desired-state reader bounds what a file can make it do (issue 8): nesting depth, number
sizes, problem counts and lengths, and what kind of file it reads. Each is a clear problem, never
a traceback or a hang."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from control_plane.desired import DesiredStateError, load_desired, parse_desired
from control_plane.desired.errors import MAX_MESSAGE_CHARS, MAX_PROBLEMS
from control_plane.desired.loader import MAX_FILE_BYTES
from control_plane.desired.yaml_nodes import MAX_DEPTH

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
    assert not any("levels deep" in m for m in problems_of(text))
    load_desired(EXAMPLE)  # the real format is far from the bound


@pytest.mark.parametrize(
    "opener", ["y: a:'b\n", 'y: a:"b\n', "y: a'b\n", "y: #\n", "y: {a: 'b', c: [\"d\"]}\n"])
def test_the_nesting_bound_follows_yamls_own_tokenisation(opener: str) -> None:
    """`y: a:'b` is a plain scalar in YAML, not an opening quote: a pre-parse check that took it
    for one let 6,000 levels of flow nesting after it reach the scanner (16 s of CPU)."""
    text = opener + "z: " + "[" * 6000 + "]" * 6000 + "\n"
    started = time.process_time()
    assert any(f"nested more than {MAX_DEPTH} levels deep" in m for m in problems_of(text))
    assert time.process_time() - started < 0.5  # milliseconds (measured ~2 ms)


# what a hostile file is made of: quotes, colons, flow collections, comments, escapes
_PIECES = st.sampled_from([
    "[", "]", "{", "}", ",", ":", ": ", " ", "'", '"', "\\", "#", " #", "\n", "\n  ", "- ",
    "a", "b:", "'x'", '"y"', "a:'b", "? ", "!", "&a ", "*a", "|", ">", "0", "1e9", "~", "\t",
])
# CPU time any input may cost: linear in its size (docs/security.md; measured up to ~9 µs a
# byte for valid-looking 1 MiB files on a loaded machine, milliseconds for deep nesting). The
# quadratic scanner this replaces took 16 s for a 12 KB file: far over 0.5 s + 20 µs a byte.
CPU_S_FIXED, CPU_S_PER_BYTE = 0.5, 20e-6


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(prefix=st.lists(_PIECES, max_size=40), unit=st.lists(_PIECES, min_size=1, max_size=6),
       repeats=st.integers(1, 200_000), suffix=st.lists(_PIECES, max_size=20))
def test_no_input_under_the_size_bound_costs_more_than_the_stated_cpu_time(
    prefix: list[str], unit: list[str], repeats: int, suffix: list[str]
) -> None:
    """Generated YAML: a prefix of hostile pieces, one short unit repeated up to the size bound
    (deep flow nesting when the unit opens collections), and a suffix. Whatever it is, the
    reader answers (a model or problems) within the stated CPU time."""
    unit_text = "".join(unit)
    head, tail = "".join(prefix), "".join(suffix)
    repeats = max(1, min(repeats, (MAX_FILE_BYTES - len(head) - len(tail)) // len(unit_text)))
    text = head + unit_text * repeats + tail
    started = time.process_time()
    with contextlib.suppress(DesiredStateError):
        parse_desired(text, "d.yaml")
    assert time.process_time() - started < CPU_S_FIXED + CPU_S_PER_BYTE * len(text)


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
