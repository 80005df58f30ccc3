from google.protobuf import any_pb2 as _any_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AdaptiveLifoQueuePolicyConfig(_message.Message):
    __slots__ = ("high_watermark", "low_watermark")
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOW_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    high_watermark: int
    low_watermark: int
    def __init__(self, high_watermark: _Optional[int] = ..., low_watermark: _Optional[int] = ...) -> None: ...

class FifoQueuePolicyConfig(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TypedExtensionConfig(_message.Message):
    __slots__ = ("name", "typed_config")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPED_CONFIG_FIELD_NUMBER: _ClassVar[int]
    name: str
    typed_config: _any_pb2.Any
    def __init__(self, name: _Optional[str] = ..., typed_config: _Optional[_Union[_any_pb2.Any, _Mapping]] = ...) -> None: ...

class QueuingPolicies(_message.Message):
    __slots__ = ("pending_rq_policy",)
    PENDING_RQ_POLICY_FIELD_NUMBER: _ClassVar[int]
    pending_rq_policy: TypedExtensionConfig
    def __init__(self, pending_rq_policy: _Optional[_Union[TypedExtensionConfig, _Mapping]] = ...) -> None: ...

class ClusterQueuingPoliciesCarrier(_message.Message):
    __slots__ = ("queuing_policies",)
    QUEUING_POLICIES_FIELD_NUMBER: _ClassVar[int]
    queuing_policies: QueuingPolicies
    def __init__(self, queuing_policies: _Optional[_Union[QueuingPolicies, _Mapping]] = ...) -> None: ...
