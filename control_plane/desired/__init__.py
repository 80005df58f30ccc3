"""The desired-state room: operators' YAML in, a validated immutable model out."""

from control_plane.desired.errors import DesiredStateError, Problem
from control_plane.desired.loader import (
    MAX_FILE_BYTES,
    load_desired,
    parse_desired,
    read_desired_bytes,
)
from control_plane.desired.model import Desired

__all__ = [
    "MAX_FILE_BYTES",
    "Desired",
    "DesiredStateError",
    "Problem",
    "load_desired",
    "parse_desired",
    "read_desired_bytes",
]
