"""Every kind of decision record. Add new kinds here: the writer and the CLI accept only these."""

from __future__ import annotations

from control_plane.decide.controller import STEP_KINDS
from control_plane.decide.ramp import RAMP_KINDS
from control_plane.decide.rollout import ROLLOUT_KINDS
from control_plane.decide.runs import END_KINDS

CONTROLLER_KINDS: tuple[str, ...] = STEP_KINDS
KINDS: tuple[str, ...] = (
    *CONTROLLER_KINDS,
    *END_KINDS.values(),
    *RAMP_KINDS,
    *ROLLOUT_KINDS,
    "config_applied",
    "config_rejected",
    "config_deferred",
    "nack",
    "node_connected",
    "node_disconnected",
    "node_refused",
    "node_superseded",
    "secrets_refused",
    "capability_fallback",
    "tier_action",
    "certificate",
    "tier_shed",
    "tier_lend",
    "tier_preempt",
    "tier_queue",
    "state_restored",
    "startup",
    "shutdown",
    "records_suppressed",
    "reconcile_error",
    "leader_elected",
    "leader_lost",
    "intent_quarantined",
)
