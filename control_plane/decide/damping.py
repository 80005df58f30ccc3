"""Flap damping of one origin as seen from one PoP: a penalty that grows with each healthy -> sick
onset and decays with a half-life. Pure.

BGP route-flap damping (RFC 2439) is the model, with its usual defaults: each onset adds
``damping_penalty`` (1000); the penalty halves every ``damping_half_life_ms`` (15 min); while it
is at or above ``damping_suppress`` (2000) the origin is *suppressed*: weight still leaves it as
fast as ever, but a return to it needs ``damping_return_windows`` healthy windows instead of
``return_healthy_windows``. Once the penalty has decayed below ``damping_reuse`` (750) the
origin's flap history is forgotten (its entry leaves the controller's state). A penalty never
exceeds ``damping_suppress`` x 2^4, so however often an origin flapped its suppression ends
within four half-lives of its last onset (BGP's max-suppress-time of 60 min for a 15 min
half-life).

The state holds, per origin, the penalty at its last onset and that onset's time: the penalty
now is computed from them, so a pair whose origins do not flap changes no state between ticks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from control_plane.desired.model import FailoverPolicy

CEILING_HALF_LIVES = 4  # a penalty decays from its ceiling to the suppress level in this many


@dataclass(frozen=True)
class Flap:
    """An origin's penalty as of its last onset."""

    penalty: float
    at_ms: int

    def now(self, policy: FailoverPolicy, now_ms: int) -> float:
        """The penalty decayed to ``now_ms`` (never grows between onsets)."""
        elapsed = max(0, now_ms - self.at_ms)
        return self.penalty * 0.5 ** (elapsed / policy.damping_half_life_ms)

    def to_dict(self) -> dict[str, Any]:
        return {"penalty": self.penalty, "at_ms": self.at_ms}

    @classmethod
    def from_dict(cls, data: Any) -> Flap:
        if (not isinstance(data, dict) or set(data) != {"penalty", "at_ms"}
                or isinstance(data["penalty"], bool)
                or not isinstance(data["penalty"], int | float) or data["penalty"] < 0
                or type(data["at_ms"]) is not int or data["at_ms"] < 0):
            raise ValueError(f"a flap must be {{penalty: number >= 0, at_ms: integer >= 0}}, "
                             f"got {data!r}")
        return cls(float(data["penalty"]), data["at_ms"])


def ceiling(policy: FailoverPolicy) -> float:
    return float(policy.damping_suppress * 2 ** CEILING_HALF_LIVES)


def onset(flap: Flap | None, policy: FailoverPolicy, now_ms: int) -> Flap:
    """The flap after a healthy -> sick onset at ``now_ms``."""
    before = 0.0 if flap is None else flap.now(policy, now_ms)
    return Flap(min(ceiling(policy), before + policy.damping_penalty), now_ms)


def penalty(flap: Flap | None, policy: FailoverPolicy, now_ms: int) -> float:
    return 0.0 if flap is None else flap.now(policy, now_ms)


def suppressed(flap: Flap | None, policy: FailoverPolicy, now_ms: int) -> bool:
    """A return to this origin needs ``damping_return_windows`` healthy windows."""
    return penalty(flap, policy, now_ms) >= policy.damping_suppress


def remembered(flap: Flap, policy: FailoverPolicy, now_ms: int) -> bool:
    """False once the penalty has decayed below ``damping_reuse``: the history is forgotten."""
    return flap.now(policy, now_ms) >= policy.damping_reuse


def return_windows(flap: Flap | None, policy: FailoverPolicy, now_ms: int) -> int:
    """Healthy windows a return to this origin needs now."""
    if suppressed(flap, policy, now_ms):
        return max(policy.return_healthy_windows, policy.damping_return_windows)
    return policy.return_healthy_windows


def describe(name: str, flap: Flap | None, policy: FailoverPolicy, now_ms: int) -> str:
    """E.g. ``primary flap penalty 2393 >= suppress 2000: return needs 6 healthy windows``."""
    value = penalty(flap, policy, now_ms)
    if suppressed(flap, policy, now_ms):
        return (f"{name} flap penalty {value:.0f} >= suppress {policy.damping_suppress} "
                f"(half-life {policy.damping_half_life_ms / 1000:g} s): return needs "
                f"{return_windows(flap, policy, now_ms)} healthy windows")
    return (f"{name} flap penalty {value:.0f} < suppress {policy.damping_suppress}: return "
            f"needs {policy.return_healthy_windows} healthy windows")


def shown(flaps: dict[str, Flap], policy: FailoverPolicy, now_ms: int
          ) -> dict[str, dict[str, Any]]:
    """Per origin that flapped: its penalty now, whether its returns are suppressed and how many
    healthy windows a return to it needs (what records, `ballast explain` and the dashboard
    show)."""
    return {
        name: {"penalty": round(penalty(flap, policy, now_ms), 1),
               "suppressed": suppressed(flap, policy, now_ms),
               "return_windows": return_windows(flap, policy, now_ms)}
        for name, flap in sorted(flaps.items())
    }
