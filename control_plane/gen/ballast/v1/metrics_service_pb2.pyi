from control_plane.gen.ballast.v1 import prometheus_metrics_pb2 as _prometheus_metrics_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MetricsLocality(_message.Message):
    __slots__ = ("region", "zone", "sub_zone")
    REGION_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    SUB_ZONE_FIELD_NUMBER: _ClassVar[int]
    region: str
    zone: str
    sub_zone: str
    def __init__(self, region: _Optional[str] = ..., zone: _Optional[str] = ..., sub_zone: _Optional[str] = ...) -> None: ...

class MetricsNode(_message.Message):
    __slots__ = ("id", "cluster", "locality")
    ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    LOCALITY_FIELD_NUMBER: _ClassVar[int]
    id: str
    cluster: str
    locality: MetricsLocality
    def __init__(self, id: _Optional[str] = ..., cluster: _Optional[str] = ..., locality: _Optional[_Union[MetricsLocality, _Mapping]] = ...) -> None: ...

class StreamMetricsMessage(_message.Message):
    __slots__ = ("identifier", "envoy_metrics")
    class Identifier(_message.Message):
        __slots__ = ("node",)
        NODE_FIELD_NUMBER: _ClassVar[int]
        node: MetricsNode
        def __init__(self, node: _Optional[_Union[MetricsNode, _Mapping]] = ...) -> None: ...
    IDENTIFIER_FIELD_NUMBER: _ClassVar[int]
    ENVOY_METRICS_FIELD_NUMBER: _ClassVar[int]
    identifier: StreamMetricsMessage.Identifier
    envoy_metrics: _containers.RepeatedCompositeFieldContainer[_prometheus_metrics_pb2.MetricFamily]
    def __init__(self, identifier: _Optional[_Union[StreamMetricsMessage.Identifier, _Mapping]] = ..., envoy_metrics: _Optional[_Iterable[_Union[_prometheus_metrics_pb2.MetricFamily, _Mapping]]] = ...) -> None: ...

class StreamMetricsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
