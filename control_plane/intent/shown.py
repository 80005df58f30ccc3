"""The running intent as JSON and back: what the admin API's `/intent` answers, and what
`ballast plan --server` carries over to the file it plans, with the server's own rule.

Keys are "<pop>/<group>"; values are each part's own `to_dict()`. The desired state is not part
of it (only its digest and PoP names): `intent_from_json` puts the caller's in its place, which
`carry_over` never reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from control_plane.decide.controller import ControllerState
from control_plane.decide.ramp import RampState
from control_plane.decide.tiers import TierState
from control_plane.desired.model import Desired, TierActions
from control_plane.intent.running import RunningIntent, tier_key
from control_plane.intent.store import PairKey, check_weights


def intent_json(intent: RunningIntent) -> dict[str, Any]:
    def by_key(values: Mapping[PairKey, Any], shown: Any) -> dict[str, Any]:
        return {tier_key(*key): shown(value) for key, value in sorted(values.items())}

    return {
        "digest": intent.desired.digest,
        "pops": list(intent.pop_names),
        # during a rollout: PoP -> the digest of the desired state it serves (not the target)
        "serving": {pop: desired.digest for pop, desired in sorted(intent.serving.items())},
        "weights": by_key(intent.weights, dict),
        "tier_actions": by_key(intent.tier_actions, TierActions.to_dict),
        "controllers": by_key(intent.controllers, ControllerState.to_dict),
        "tier_states": by_key(intent.tier_states, TierState.to_dict),
        "ramps": by_key(intent.ramps, RampState.to_dict),
    }


def intent_from_json(data: Mapping[str, Any], desired: Desired) -> RunningIntent:
    """`intent_json`'s answer read back, with `desired` in place of the server's desired
    state. Raises ValueError (KeyError, TypeError) on anything else."""

    def by_key(part: str, read: Any) -> dict[PairKey, Any]:
        values: dict[PairKey, Any] = {}
        for key, value in data[part].items():
            pop, slash, group = key.partition("/")
            if not slash or not pop or not group:
                raise ValueError(f"{part}: key {key!r} is not <pop>/<group>")
            values[(pop, group)] = read(value)
        return values

    return RunningIntent(
        desired,
        weights=by_key("weights", check_weights),
        tier_actions=by_key("tier_actions", tier_actions_from_dict),
        controllers=by_key("controllers", ControllerState.from_dict),
        tier_states=by_key("tier_states", TierState.from_dict),
        ramps=by_key("ramps", RampState.from_dict),
    )


def tier_actions_from_dict(shown: Mapping[str, Any]) -> TierActions:
    """`TierActions.to_dict()` back to the value."""
    return TierActions(
        demote_tier=shown["demote_tier"],
        demote_to=shown["demote_to"],
        demote_share=shown["demote_share"],
        shed_tier=shown["shed_tier"],
        retry_after_s=shown["retry_after_s"],
        shed_tiers=tuple(shown["shed_tiers"]),
        limits=tuple(shown["limits"].items()),
        shed_status=tuple(shown["shed_status"].items()),
        pending_limits=tuple((shown.get("pending_limits") or {}).items()),
    )
