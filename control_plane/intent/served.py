"""The running intent as the output cache translates it (`translate/served.py`, `Served`): per
PoP the desired state it serves and its `PopIntent`, made from the last one anew only for the
PoPs a change touches, on the worker thread the change prepares on.
"""

from __future__ import annotations

from collections.abc import Collection

from control_plane.intent.running import RunningIntent
from control_plane.translate.pop import PopIntent, translate_pop
from control_plane.translate.resources import Capabilities, PopResources
from control_plane.translate.served import Served


def served_of(intent: RunningIntent, previous: Served | None = None,
              pops: Collection[str] | None = None) -> Served:
    """`intent` as the cache translates it: each PoP's desired state, and its `PopIntent`
    (`RunningIntent.for_pop`) made anew for `pops` (None: every PoP) and for PoPs `previous`
    did not have, taken over from `previous` for the others (a change touches only `pops`)."""
    names = intent.pop_names
    old = {} if previous is None or pops is None else previous.intents
    fresh = set(names) if pops is None else set(pops)
    intents: dict[str, PopIntent] = {
        pop: intent.for_pop(pop) if pop in fresh or pop not in old else old[pop]
        for pop in names}
    return Served(
        pop_names=names,
        desired={pop: intent.desired_of(pop) for pop in names},
        intents=intents,
        added_filters=frozenset(intent.desired.extra_filter_types.union(
            *(desired.extra_filter_types for desired in intent.serving.values()))),
    )


def translate_intent(intent: RunningIntent, pop: str, caps: Capabilities,
                     previous: PopResources | None = None) -> PopResources:
    """What nodes of `pop` with `caps` get under `intent`: the desired state `pop` serves
    (during a rollout, maybe not the target) with what the intent holds for it, translated (a
    plan, a reload's diff, tests: the cache translates from the `Served` it is handed)."""
    return translate_pop(intent.desired_of(pop), pop, caps, intent.for_pop(pop),
                         previous=previous)
