"""Adaptive tier re-prioritization of one (PoP, origin group): one pure call per reconcile tick.

Seed 000: "If P0 wait time exceeds 35ms for more than 30 seconds, we automatically demote 50% of
P1 to P2 and shed P2 entirely." Envoy has no queue-wait stat, so the trigger is the number of
requests waiting for a connection of the trigger tier's cluster (``upstream_rq_pending_active``,
its highest value in the window). The rules, with the defaults of ``TierActionPolicy``:

1. **Disabled.** ``enabled: false`` lifts active actions at once and otherwise does nothing.
2. **Fail static.** No reading for the trigger tier, or a reading older than ``stale_after_ms``:
   the current action (on or off) and the timers are held, and the reason is given.
3. **Trigger.** The trigger holds at a tick when the pending maximum exceeds ``trigger_pending``.
   Off → on once it has held at every tick for at least ``for_ms`` (counted from the first tick
   that saw it); any tick without it restarts the count.
4. **Recover.** On → off once ``recover_after_ms`` have passed without the trigger (counted from
   the first tick without it); a tick with the trigger restarts the count.

``kind`` is ``tier_action`` only when the action changes (on → off or off → on); other ticks have
nothing to log, and their ``rule`` still says where the timers stand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from control_plane.decide.signals import TierPending
from control_plane.desired.model import TierActionPolicy, TierActions

TierKind = Literal["tier_action"]


def _optional_ms(data: Mapping[str, Any], key: str) -> int | None:
    value = data[key]
    if value is not None and (type(value) is not int or value < 0):
        raise ValueError(f"tier state {key} must be null or milliseconds >= 0, got {value!r}")
    return value


@dataclass(frozen=True)
class TierState:
    """What the tier step remembers between ticks (saved as JSON under "<pop>/<group>")."""

    active: bool = False
    trigger_since_ms: int | None = None  # first tick of the current run with the trigger
    clear_since_ms: int | None = None  # first tick of the current run without it (while active)
    active_since_ms: int | None = None  # when the actions went on

    @property
    def idle(self) -> bool:
        return self == TierState()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> TierState:
        """Inverse of ``to_dict``; raises ValueError on anything else."""
        keys = {"active", "trigger_since_ms", "clear_since_ms", "active_since_ms"}
        if not isinstance(data, dict) or set(data) != keys:
            raise ValueError(f"tier state must have exactly {sorted(keys)}, got {data!r}")
        if not isinstance(data["active"], bool):
            raise ValueError(f"tier state active must be true or false, got {data['active']!r}")
        return cls(
            active=data["active"],
            trigger_since_ms=_optional_ms(data, "trigger_since_ms"),
            clear_since_ms=_optional_ms(data, "clear_since_ms"),
            active_since_ms=_optional_ms(data, "active_since_ms"),
        )


@dataclass(frozen=True)
class TierStepResult:
    """What one tick decided for the tier actions of one (PoP, group)."""

    kind: TierKind | None  # "tier_action" when the actions went on or off, else None
    rule: str  # in words, with the numbers
    state: TierState  # the new state
    actions: TierActions | None  # the actions in force after this tick (None: none)
    inputs: dict[str, Any]  # JSON-ready: the reading, time, state before

    def record_fields(self) -> dict[str, Any]:
        """Fields for ``DecisionLog.record(result.kind, pop=..., group=..., **these)``."""
        return {
            "inputs": self.inputs,
            "rule": self.rule,
            "detail": {
                "active": self.state.active,
                "actions": None if self.actions is None else self.actions.to_dict(),
                "state": self.state.to_dict(),
            },
        }


def describe_actions(actions: TierActions) -> str:
    parts = []
    if actions.demote_tier and actions.demote_to and actions.demote_share:
        parts.append(f"demote {actions.demote_share}% of {actions.demote_tier} to "
                     f"{actions.demote_to}")
    if actions.shed_tier:
        parts.append(f"shed {actions.shed_tier} (503, retry-after {actions.retry_after_s} s)")
    return ", ".join(parts) or "no action configured"


def _s(ms: int) -> str:
    return f"{ms / 1000:g} s"


def tier_step(
    policy: TierActionPolicy,
    state: TierState,
    pending_by_tier: Mapping[str, TierPending] | None,
    now_ms: int,
) -> TierStepResult:
    """One tick of the tier actions of one (PoP, origin group). Pure.

    ``pending_by_tier``: tier name -> the window's pending maximum (None: no readings at all).
    """
    reading = (pending_by_tier or {}).get(policy.trigger_tier)
    inputs: dict[str, Any] = {
        "now_ms": now_ms,
        "trigger_tier": policy.trigger_tier,
        "trigger_pending": policy.trigger_pending,
        "pending": None if reading is None else asdict(reading),
        "state_before": state.to_dict(),
    }
    tier, limit = policy.trigger_tier, policy.trigger_pending

    def result(kind: TierKind | None, rule: str, new: TierState) -> TierStepResult:
        actions = policy.actions() if new.active and policy.enabled else None
        return TierStepResult(kind, rule, new, actions, inputs)

    if not policy.enabled:
        if state.active:
            return result("tier_action", "tier actions disabled in the desired state: "
                          f"lifted ({describe_actions(policy.actions())})", TierState())
        return result(None, "tier actions disabled", TierState())
    now_on = "on" if state.active else "off"
    if reading is None:
        return result(None, f"fail static: no pending metrics for tier {tier}; actions stay "
                      f"{now_on}", state)
    age = now_ms - reading.observed_at_ms
    if age > policy.stale_after_ms:
        return result(None, f"fail static: pending metrics of tier {tier} stale ({_s(age)} > "
                      f"{_s(policy.stale_after_ms)}); actions stay {now_on}", state)
    pending = reading.pending_max
    triggered = pending > limit
    seen = f"{tier} pending max {pending:g} {'>' if triggered else '≤'} {limit}"
    if not state.active:
        if not triggered:
            return result(None, f"{seen}: no trigger", TierState())
        since = now_ms if state.trigger_since_ms is None else state.trigger_since_ms
        held = now_ms - since
        if held >= policy.for_ms:
            return result(
                "tier_action",
                f"{seen} for {_s(held)} (≥ {_s(policy.for_ms)}): "
                f"{describe_actions(policy.actions())}",
                TierState(active=True, trigger_since_ms=since, active_since_ms=now_ms),
            )
        return result(None, f"{seen} for {_s(held)} of {_s(policy.for_ms)}",
                      TierState(trigger_since_ms=since))
    if triggered:
        return result(None, f"{seen}: actions stay on",
                      TierState(active=True, trigger_since_ms=state.trigger_since_ms,
                                active_since_ms=state.active_since_ms))
    clear = now_ms if state.clear_since_ms is None else state.clear_since_ms
    quiet = now_ms - clear
    if quiet >= policy.recover_after_ms:
        return result(
            "tier_action",
            f"{seen} for {_s(quiet)} (≥ recover_after {_s(policy.recover_after_ms)}): lifted "
            f"({describe_actions(policy.actions())})",
            TierState(),
        )
    return result(None, f"{seen} for {_s(quiet)} of {_s(policy.recover_after_ms)}; actions "
                  "stay on",
                  TierState(active=True, clear_since_ms=clear,
                            active_since_ms=state.active_since_ms))
