"""The two walks of docs/architecture.md ("Two walks") are the walks the code runs.

Each is measured: a real reconcile tick that moves a sick origin's weights, and a real reload
of an edit of the example's desired state (a `BallastService` on loopback), run with a profile
hook on this thread and on the worker threads started for it. Every call of a function of
control_plane/ that is handed the value — the new weights, the new `Desired` — as an argument
other than `self`, or inside one (a field, an item: four levels deep), is a step; the rooms of
the steps, in order, up to the output cache's commit (where ads/ takes what is served), are the
walk, a room listed again each time the value comes back to it. The doc shows that list.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import sys
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path
from types import FrameType
from typing import Any

from control_plane.decisions.log import DecisionLog
from control_plane.decisions.recorder import DecisionRecorder
from control_plane.desired.model import Desired
from control_plane.intent.sqlite_store import StateStore
from control_plane.reconcile.reconcile import Reconciler
from control_plane.translate.resources import Capabilities
from control_plane.xds_port.server import intent_and_cache
from harness.models import example_desired
from tests.support.example_service import example_service
from tests.test_app_reconcile import T0, ScriptedSource

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = f"{ROOT / 'control_plane'}/"
PLAIN = (str, bytes, int, float, bool, type(None))
RESUMABLE = inspect.CO_COROUTINE | inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR


class Trail:
    """The rooms of control_plane/ whose functions are handed the value (as a parameter other
    than `self`, or inside one), in the order the program enters them."""

    def __init__(self, is_value: Callable[[Any], bool]) -> None:
        self.is_value = is_value
        self.steps: list[tuple[str, str]] = []
        self.on = False
        self._started: dict[int, FrameType] = {}

    def holds(self, value: Any, depth: int = 4,
              seen: dict[tuple[int, int], bool] | None = None) -> bool:
        """Whether `value` is the value or holds it within `depth` levels (fields, items);
        `seen`: what one call's scan found so far, per object and depth (its arguments share
        objects)."""
        if isinstance(value, PLAIN):
            return False
        seen = {} if seen is None else seen
        if (id(value), depth) in seen:
            return seen[id(value), depth]
        seen[id(value), depth] = found = self.is_value(value)
        if not found and depth:
            if isinstance(value, Mapping):
                inside = list(islice(value.values(), 64))
            elif isinstance(value, list | tuple | set | frozenset):
                inside = list(islice(value, 64))
            else:
                inside = list(getattr(value, "__dict__", {}).values()) + [
                    getattr(value, slot, None) for cls in type(value).__mro__
                    for slot in getattr(cls, "__slots__", ())]
            found = any(self.holds(item, depth - 1, seen) for item in inside)
            seen[id(value), depth] = found
        return found

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on or event != "call":
            return
        code = frame.f_code
        if not code.co_filename.startswith(PACKAGE):
            return
        if code.co_flags & RESUMABLE:  # a coroutine's or generator's frame: a resume is no call
            if self._started.get(id(frame)) is frame:
                return
            self._started[id(frame)] = frame
        count = code.co_argcount + code.co_kwonlyargcount
        names = [n for n in code.co_varnames[:count] if n not in ("self", "cls")]
        local = frame.f_locals
        seen: dict[tuple[int, int], bool] = {}
        if any(self.holds(local.get(name), seen=seen) for name in names):
            where = code.co_filename[len(PACKAGE):]
            self.steps.append((where.split("/", 1)[0], f"{where}:{code.co_qualname}"))

    async def __aenter__(self) -> Trail:
        """Traced: this thread, and worker threads started from now (the loop's own pool of
        them replaced by a new one, whose threads start traced)."""
        sys.setprofile(self.profile)
        threading.setprofile(self.profile)
        self._pool = ThreadPoolExecutor(thread_name_prefix="walk")
        asyncio.get_running_loop().set_default_executor(self._pool)
        return self

    async def __aexit__(self, *exc: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor())  # untraced
        self._pool.shutdown()


def to_commit(steps: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The steps up to the output cache's commit (where ads/ takes what is served)."""
    for number, (_, where) in enumerate(steps):
        if where == "ads/snapshots.py:SnapshotCache.commit":
            return steps[:number + 1]
    raise AssertionError("the value never reached the output cache's commit: "
                         + ", ".join(where for _, where in steps))


def rooms(steps: list[tuple[str, str]]) -> list[str]:
    """The rooms in the order the value enters them up to the commit, a room listed again each
    time the value comes back to it."""
    entered: list[str] = []
    for room, _ in to_commit(steps):
        if not entered or entered[-1] != room:
            entered.append(room)
    return entered


async def edit_walk(tmp_path: Path) -> list[tuple[str, str]]:
    """A desired-state edit (a PoP's listener port offset) applied by the reload: the calls
    handed the new `Desired`."""
    async with Trail(lambda value: False) as trail, example_service(tmp_path) as (service, text):
        edited = text.replace("port_offset: 1}", "port_offset: 2}", 1)
        assert edited != text
        digest = hashlib.sha256(edited.encode()).hexdigest()
        trail.is_value = lambda value: isinstance(value, Desired) and value.digest == digest
        trail.on = True
        assert await service.reload.apply(edited.encode())
        trail.on = False
    return trail.steps


async def _ticks(tmp_path: Path, trail: Trail | None = None, traced: int = -1
                 ) -> tuple[int, dict[str, int]]:
    """A reconcile loop over the example's intent and output cache with one origin of ewr
    sick (30 % 5xx): ticks until its weights move; the tick `traced` is traced. Which tick it
    is and what the weights moved to."""
    tmp_path.mkdir()
    intent, cache = intent_and_cache(example_desired(), store=StateStore(tmp_path),
                                     recorder=DecisionRecorder(DecisionLog(tmp_path)))
    for pop in ("ewr", "sjc"):  # as if a node of each PoP were connected
        cache.resources(pop, Capabilities())
    source = ScriptedSource()
    source.error_rate = 0.3
    reconciler = Reconciler(intent, source, seed=7)
    home = intent.weights("ewr", "shop")
    for tick in range(6):
        if trail is not None:
            trail.on = tick == traced
        await reconciler.tick(T0 + tick * 20_000)
        if trail is not None:
            trail.on = False
        if intent.weights("ewr", "shop") != home:
            return tick, dict(intent.weights("ewr", "shop"))
    raise AssertionError("the sick origin's weights never moved")


async def weight_walk(tmp_path: Path) -> list[tuple[str, str]]:
    """The sick origin's first move, twice alike: the second time the tick that moves it is
    traced (the calls handed the new weights)."""
    tick, moved = await _ticks(tmp_path / "first")
    async with Trail(lambda value: isinstance(value, dict) and value == moved) as trail:
        assert await _ticks(tmp_path / "traced", trail, tick) == (tick, moved)
    return trail.steps


WALKS = {"An origin's weight": weight_walk, "A desired-state edit": edit_walk}
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def shown(entered: list[str]) -> str:
    """The line docs/architecture.md shows for a walk."""
    return (f"As it runs: {' → '.join(f'`{room}/`' for room in entered)}: "
            f"{len(set(entered))} rooms, {len(entered) - len(set(entered))} entries again.")


def walk_text(title: str) -> str:
    """What docs/architecture.md says under a walk's title (to the next title or section)."""
    text = ARCHITECTURE.read_text()
    section = text[text.index("## Two walks"):]
    section = section[:section.index("\n## ", 1)]
    start = section.index(f"**{title}**")
    following = [section.index(f"**{other}**") for other in WALKS
                 if section.index(f"**{other}**") > start]
    return section[start:min(following, default=len(section))]


async def test_the_walks_in_the_architecture_doc_are_those_the_code_runs(tmp_path: Path
                                                                         ) -> None:
    for number, (title, walk) in enumerate(WALKS.items()):
        (tmp_path / str(number)).mkdir()
        steps = await walk(tmp_path / str(number))
        expected = shown(rooms(steps))
        assert expected in " ".join(walk_text(title).split()), (
            f"docs/architecture.md's walk {title!r} should read (the steps: "
            + ", ".join(where for _, where in steps[:len(to_commit(steps))]) + "):\n"
            + expected)
