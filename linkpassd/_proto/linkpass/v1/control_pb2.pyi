from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    VERDICT_UP: _ClassVar[Verdict]
    VERDICT_DEGRADED: _ClassVar[Verdict]
    VERDICT_DOWN: _ClassVar[Verdict]
VERDICT_UNSPECIFIED: Verdict
VERDICT_UP: Verdict
VERDICT_DEGRADED: Verdict
VERDICT_DOWN: Verdict

class PortState(_message.Message):
    __slots__ = ("port", "verdict", "carrier", "phase", "since", "evidence")
    PORT_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    CARRIER_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    port: str
    verdict: Verdict
    carrier: bool
    phase: str
    since: float
    evidence: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, port: _Optional[str] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., carrier: _Optional[bool] = ..., phase: _Optional[str] = ..., since: _Optional[float] = ..., evidence: _Optional[_Iterable[str]] = ...) -> None: ...

class LinkSample(_message.Message):
    __slots__ = ("port", "present", "ifindex", "admin_up", "carrier", "operstate", "carrier_up_count", "carrier_down_count")
    PORT_FIELD_NUMBER: _ClassVar[int]
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    IFINDEX_FIELD_NUMBER: _ClassVar[int]
    ADMIN_UP_FIELD_NUMBER: _ClassVar[int]
    CARRIER_FIELD_NUMBER: _ClassVar[int]
    OPERSTATE_FIELD_NUMBER: _ClassVar[int]
    CARRIER_UP_COUNT_FIELD_NUMBER: _ClassVar[int]
    CARRIER_DOWN_COUNT_FIELD_NUMBER: _ClassVar[int]
    port: str
    present: bool
    ifindex: int
    admin_up: bool
    carrier: bool
    operstate: str
    carrier_up_count: int
    carrier_down_count: int
    def __init__(self, port: _Optional[str] = ..., present: _Optional[bool] = ..., ifindex: _Optional[int] = ..., admin_up: _Optional[bool] = ..., carrier: _Optional[bool] = ..., operstate: _Optional[str] = ..., carrier_up_count: _Optional[int] = ..., carrier_down_count: _Optional[int] = ...) -> None: ...

class RailStatus(_message.Message):
    __slots__ = ("name", "port", "address", "table", "active_rail", "active_port")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_RAIL_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_PORT_FIELD_NUMBER: _ClassVar[int]
    name: str
    port: str
    address: str
    table: int
    active_rail: str
    active_port: str
    def __init__(self, name: _Optional[str] = ..., port: _Optional[str] = ..., address: _Optional[str] = ..., table: _Optional[int] = ..., active_rail: _Optional[str] = ..., active_port: _Optional[str] = ...) -> None: ...

class GroupStatus(_message.Message):
    __slots__ = ("name", "destination", "table", "members", "min_paths")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    MIN_PATHS_FIELD_NUMBER: _ClassVar[int]
    name: str
    destination: str
    table: int
    members: _containers.RepeatedScalarFieldContainer[str]
    min_paths: int
    def __init__(self, name: _Optional[str] = ..., destination: _Optional[str] = ..., table: _Optional[int] = ..., members: _Optional[_Iterable[str]] = ..., min_paths: _Optional[int] = ...) -> None: ...

class DaemonStatus(_message.Message):
    __slots__ = ("hostname", "version", "config_source", "started_at", "ports", "links", "rails", "groups", "reconciles", "netlink_writes", "last_reconcile_at", "last_error", "served_at")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONFIG_SOURCE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    RAILS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    RECONCILES_FIELD_NUMBER: _ClassVar[int]
    NETLINK_WRITES_FIELD_NUMBER: _ClassVar[int]
    LAST_RECONCILE_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    SERVED_AT_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    version: str
    config_source: str
    started_at: float
    ports: _containers.RepeatedCompositeFieldContainer[PortState]
    links: _containers.RepeatedCompositeFieldContainer[LinkSample]
    rails: _containers.RepeatedCompositeFieldContainer[RailStatus]
    groups: _containers.RepeatedCompositeFieldContainer[GroupStatus]
    reconciles: int
    netlink_writes: int
    last_reconcile_at: float
    last_error: str
    served_at: float
    def __init__(self, hostname: _Optional[str] = ..., version: _Optional[str] = ..., config_source: _Optional[str] = ..., started_at: _Optional[float] = ..., ports: _Optional[_Iterable[_Union[PortState, _Mapping]]] = ..., links: _Optional[_Iterable[_Union[LinkSample, _Mapping]]] = ..., rails: _Optional[_Iterable[_Union[RailStatus, _Mapping]]] = ..., groups: _Optional[_Iterable[_Union[GroupStatus, _Mapping]]] = ..., reconciles: _Optional[int] = ..., netlink_writes: _Optional[int] = ..., last_reconcile_at: _Optional[float] = ..., last_error: _Optional[str] = ..., served_at: _Optional[float] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: DaemonStatus
    def __init__(self, status: _Optional[_Union[DaemonStatus, _Mapping]] = ...) -> None: ...

class ListLinksRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Link(_message.Message):
    __slots__ = ("port", "rails", "link", "state")
    PORT_FIELD_NUMBER: _ClassVar[int]
    RAILS_FIELD_NUMBER: _ClassVar[int]
    LINK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    port: str
    rails: _containers.RepeatedScalarFieldContainer[str]
    link: LinkSample
    state: PortState
    def __init__(self, port: _Optional[str] = ..., rails: _Optional[_Iterable[str]] = ..., link: _Optional[_Union[LinkSample, _Mapping]] = ..., state: _Optional[_Union[PortState, _Mapping]] = ...) -> None: ...

class ListLinksResponse(_message.Message):
    __slots__ = ("links", "served_at")
    LINKS_FIELD_NUMBER: _ClassVar[int]
    SERVED_AT_FIELD_NUMBER: _ClassVar[int]
    links: _containers.RepeatedCompositeFieldContainer[Link]
    served_at: float
    def __init__(self, links: _Optional[_Iterable[_Union[Link, _Mapping]]] = ..., served_at: _Optional[float] = ...) -> None: ...
