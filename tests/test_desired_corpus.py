"""Every bad file under tests/desired_bad/ fails with exactly the problems its header promises.

Each file starts with `# expect: LINE:COL: PATH: MESSAGE` lines (or `# expect: MESSAGE` for a
problem of the whole file); the file's path is the prefix of every reported line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from control_plane.desired import DesiredStateError, load_desired

CORPUS = Path(__file__).parent / "desired_bad"
FILES = sorted(CORPUS.glob("*.yaml"))


def expected_lines(path: Path) -> list[str]:
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("# expect: "):
            break
        expect = line.removeprefix("# expect: ")
        lines.append(f"{path}:{expect}" if expect[0].isdigit() else f"{path}: {expect}")
    return lines


def test_the_corpus_is_big_enough() -> None:
    assert len(FILES) >= 30
    assert all(expected_lines(f) for f in FILES)


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_bad_file_reports_exactly_the_expected_problems(path: Path) -> None:
    with pytest.raises(DesiredStateError) as caught:
        load_desired(str(path))
    reported = [str(p) for p in caught.value.problems]
    assert sorted(reported) == sorted(expected_lines(path))
