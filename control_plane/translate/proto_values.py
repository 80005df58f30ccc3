"""Small protobuf value builders shared by the translation modules."""

from __future__ import annotations

from google.protobuf.any_pb2 import Any
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message


def duration_ms(milliseconds: int) -> Duration:
    value = Duration()
    value.FromMilliseconds(milliseconds)
    return value


def packed(message: Message) -> Any:
    value = Any()
    value.Pack(message)
    return value
