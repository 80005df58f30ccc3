"""Whatever an operator does to the file, loading ends in a model or a DesiredStateError.

Random mutations of the shipped example, of its text and of its structure, must never let a
KeyError, TypeError or any other exception escape, and every problem must carry a position.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from control_plane.desired import Desired, DesiredStateError, parse_desired

EXAMPLE_TEXT = (Path(__file__).parent.parent / "examples" / "desired.yaml").read_text()
EXAMPLE_DATA = yaml.safe_load(EXAMPLE_TEXT)
FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 100_000), st.floats(allow_nan=True),
    st.sampled_from(["", "800ms", "2s", "fifo", "adaptive_lifo", "primary", "ewr", "critical",
                     "shop", "*", "/x", "2%", "1.5s", "10%", "BAD.name", "127.0.0.1"]),
    st.text(max_size=8),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6)


def load(text: str) -> Desired | None:
    try:
        return parse_desired(text, "mutant.yaml")
    except DesiredStateError as error:
        assert error.problems
        assert all(p.source == "mutant.yaml" and p.line >= 0 for p in error.problems)
        return None


def paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(data, dict):
        for key, value in data.items():
            found += paths(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            found += paths(value, (*prefix, index))
    return found


ALL_PATHS = paths(EXAMPLE_DATA)[1:]


def mutate(data: Any, path: tuple[Any, ...], action: str, value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    copy: Any = dict(data) if isinstance(data, dict) else list(data)
    if rest:
        copy[head] = mutate(data[head], rest, action, value)
    elif action == "delete":
        del copy[head]
    elif action == "add" and isinstance(copy[head], dict):
        copy[head] = {**copy[head], "extra_key": value}
    else:
        copy[head] = value
    return copy


@FAST
@given(path=st.sampled_from(ALL_PATHS), action=st.sampled_from(["replace", "delete", "add"]),
       value=values)
def test_structural_mutations_only_raise_desired_state_error(
        path: tuple[Any, ...], action: str, value: Any) -> None:
    load(yaml.safe_dump(mutate(EXAMPLE_DATA, path, action, value), sort_keys=False))


@FAST
@given(data=st.data())
def test_text_mutations_only_raise_desired_state_error(data: st.DataObject) -> None:
    lines = EXAMPLE_TEXT.splitlines(keepends=True)
    index = data.draw(st.integers(0, len(lines) - 1))
    line = lines[index]
    start = data.draw(st.integers(0, len(line)))
    end = data.draw(st.integers(start, len(line)))
    insert = data.draw(st.text(alphabet=" :-{}[],&*!#'\"\t|>%0123456789abz.\n", max_size=4))
    lines[index] = line[:start] + insert + line[end:]
    if data.draw(st.booleans()):
        del lines[data.draw(st.integers(0, len(lines) - 1))]
    load("".join(lines))


def test_the_unmutated_example_loads() -> None:
    assert load(EXAMPLE_TEXT) is not None
    assert load(yaml.safe_dump(EXAMPLE_DATA)) is not None
