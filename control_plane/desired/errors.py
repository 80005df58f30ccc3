"""Problems found in a desired-state file, and the one exception that carries all of them.

A `Problem` prints like a compiler message, `file:line:column: path: message`, so editors and
terminals can jump to it. Line and column are 1-based; line 0 means the problem concerns the file
as a whole (unreadable, empty, too large) and the position is left out. An empty path (the
document root) is left out too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

MAX_PROBLEMS = 200  # kept per file; the rest are counted in one last problem
MAX_MESSAGE_CHARS = 300  # of a problem's message and path (values in them are the file's)


@dataclass(frozen=True)
class Problem:
    source: str
    line: int
    column: int
    path: str
    message: str

    def __str__(self) -> str:
        where = self.source if self.line == 0 else f"{self.source}:{self.line}:{self.column}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class DesiredStateError(Exception):
    """The desired state could not be loaded; `problems` lists every reason, in file order."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.line, p.column, p.path, p.message))
        super().__init__("\n".join(str(p) for p in self.problems))


@dataclass(frozen=True)
class At:
    """A place in the document: 1-based line and column, and the dotted path to the value."""

    line: int
    column: int
    path: str

    @classmethod
    def of(cls, node: yaml.Node, path: str) -> At:
        return cls(node.start_mark.line + 1, node.start_mark.column + 1, path)

    @classmethod
    def mark(cls, mark: yaml.Mark, path: str) -> At:
        return cls(mark.line + 1, mark.column + 1, path)


def _clip(text: str) -> str:
    if len(text) <= MAX_MESSAGE_CHARS:
        return text
    return f"{text[:MAX_MESSAGE_CHARS]}… [{len(text):,} characters]"


@dataclass
class Sink:
    """Collects the problems of one file so all of them are reported at once (the first
    `MAX_PROBLEMS`, each message and path at most `MAX_MESSAGE_CHARS`; the rest counted)."""

    source: str
    problems: list[Problem] = field(default_factory=list)
    _seen: set[Problem] = field(default_factory=set)
    _more: int = 0

    def add(self, at: At, message: str) -> None:
        self._keep(Problem(self.source, at.line, at.column, _clip(at.path), _clip(message)))

    def whole_file(self, message: str) -> None:
        self._keep(Problem(self.source, 0, 0, "", _clip(message)))

    def _keep(self, problem: Problem) -> None:
        if problem in self._seen:
            return
        if len(self.problems) >= MAX_PROBLEMS:
            self._more += 1
            return
        self._seen.add(problem)
        self.problems.append(problem)

    def raise_if_any(self) -> None:
        if self.problems:
            more = []
            if self._more:
                more = [Problem(self.source, 0, 0, "", f"... and {self._more:,} more problems "
                                f"(the first {MAX_PROBLEMS} are listed)")]
            raise DesiredStateError(self.problems + more)
