"""A decision's inputs, made JSON-ready only when the decision is recorded. Pure.

Every step (controller, ramp, tier controller) returns with its result everything needed to
replay it. A tick steps every (PoP, origin group) but records only what changed — a steady
fleet of 2,000 pairs records nothing — so building those dicts eagerly made tens of thousands
of objects per tick that were thrown away, and kept the garbage collector busy while the event
loop waited for the interpreter. `LazyInputs` holds the function that makes them instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class LazyInputs:
    """The inputs of one decision: `json()` makes them once, on first use, by calling `make`
    with `args` (a module-level function and plain arguments: no closure, so one decision
    costs this object and its argument tuple)."""

    __slots__ = ("_args", "_made", "_make")

    def __init__(self, make: Callable[..., dict[str, Any]], *args: Any) -> None:
        self._make = make
        self._args = args
        self._made: dict[str, Any] | None = None

    def json(self) -> dict[str, Any]:
        if self._made is None:
            self._made = self._make(*self._args)
        return self._made

    def __getitem__(self, key: str) -> Any:
        return self.json()[key]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyInputs):
            return self.json() == other.json()
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LazyInputs({self.json()!r})"
