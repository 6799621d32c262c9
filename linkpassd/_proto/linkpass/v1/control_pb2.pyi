import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
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

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_KIND_UNSPECIFIED: _ClassVar[EventKind]
    EVENT_KIND_STARTED: _ClassVar[EventKind]
    EVENT_KIND_STOPPED: _ClassVar[EventKind]
    EVENT_KIND_VERDICT: _ClassVar[EventKind]
    EVENT_KIND_RAIL_PATH: _ClassVar[EventKind]
    EVENT_KIND_GROUP_MEMBERS: _ClassVar[EventKind]
    EVENT_KIND_DRAIN: _ClassVar[EventKind]
    EVENT_KIND_UNDRAIN: _ClassVar[EventKind]
    EVENT_KIND_RELOAD: _ClassVar[EventKind]
    EVENT_KIND_RELOAD_REFUSED: _ClassVar[EventKind]
    EVENT_KIND_CONFLICT: _ClassVar[EventKind]
    EVENT_KIND_RESYNC: _ClassVar[EventKind]
    EVENT_KIND_RECONCILE_FAILED: _ClassVar[EventKind]
    EVENT_KIND_SIGNAL: _ClassVar[EventKind]
    EVENT_KIND_ANNOUNCE: _ClassVar[EventKind]
    EVENT_KIND_FENCE: _ClassVar[EventKind]

class Severity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEVERITY_UNSPECIFIED: _ClassVar[Severity]
    SEVERITY_INFO: _ClassVar[Severity]
    SEVERITY_WARNING: _ClassVar[Severity]
    SEVERITY_ERROR: _ClassVar[Severity]
VERDICT_UNSPECIFIED: Verdict
VERDICT_UP: Verdict
VERDICT_DEGRADED: Verdict
VERDICT_DOWN: Verdict
EVENT_KIND_UNSPECIFIED: EventKind
EVENT_KIND_STARTED: EventKind
EVENT_KIND_STOPPED: EventKind
EVENT_KIND_VERDICT: EventKind
EVENT_KIND_RAIL_PATH: EventKind
EVENT_KIND_GROUP_MEMBERS: EventKind
EVENT_KIND_DRAIN: EventKind
EVENT_KIND_UNDRAIN: EventKind
EVENT_KIND_RELOAD: EventKind
EVENT_KIND_RELOAD_REFUSED: EventKind
EVENT_KIND_CONFLICT: EventKind
EVENT_KIND_RESYNC: EventKind
EVENT_KIND_RECONCILE_FAILED: EventKind
EVENT_KIND_SIGNAL: EventKind
EVENT_KIND_ANNOUNCE: EventKind
EVENT_KIND_FENCE: EventKind
SEVERITY_UNSPECIFIED: Severity
SEVERITY_INFO: Severity
SEVERITY_WARNING: Severity
SEVERITY_ERROR: Severity

class PortState(_message.Message):
    __slots__ = ("port", "verdict", "carrier", "phase", "since", "evidence", "drain", "hold_until")
    PORT_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    CARRIER_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    HOLD_UNTIL_FIELD_NUMBER: _ClassVar[int]
    port: str
    verdict: Verdict
    carrier: bool
    phase: str
    since: float
    evidence: _containers.RepeatedScalarFieldContainer[str]
    drain: DrainInfo
    hold_until: float
    def __init__(self, port: _Optional[str] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., carrier: _Optional[bool] = ..., phase: _Optional[str] = ..., since: _Optional[float] = ..., evidence: _Optional[_Iterable[str]] = ..., drain: _Optional[_Union[DrainInfo, _Mapping]] = ..., hold_until: _Optional[float] = ...) -> None: ...

class DrainInfo(_message.Message):
    __slots__ = ("reason", "by", "since", "until")
    REASON_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    reason: str
    by: str
    since: _timestamp_pb2.Timestamp
    until: _timestamp_pb2.Timestamp
    def __init__(self, reason: _Optional[str] = ..., by: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

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

class Thresholds(_message.Message):
    __slots__ = ("high_alarm", "high_warn", "low_warn", "low_alarm")
    HIGH_ALARM_FIELD_NUMBER: _ClassVar[int]
    HIGH_WARN_FIELD_NUMBER: _ClassVar[int]
    LOW_WARN_FIELD_NUMBER: _ClassVar[int]
    LOW_ALARM_FIELD_NUMBER: _ClassVar[int]
    high_alarm: float
    high_warn: float
    low_warn: float
    low_alarm: float
    def __init__(self, high_alarm: _Optional[float] = ..., high_warn: _Optional[float] = ..., low_warn: _Optional[float] = ..., low_alarm: _Optional[float] = ...) -> None: ...

class ModuleIdentity(_message.Message):
    __slots__ = ("spec", "form_factor", "vendor", "part", "serial", "revision", "spec_revision")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    FORM_FACTOR_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SPEC_REVISION_FIELD_NUMBER: _ClassVar[int]
    spec: str
    form_factor: str
    vendor: str
    part: str
    serial: str
    revision: str
    spec_revision: str
    def __init__(self, spec: _Optional[str] = ..., form_factor: _Optional[str] = ..., vendor: _Optional[str] = ..., part: _Optional[str] = ..., serial: _Optional[str] = ..., revision: _Optional[str] = ..., spec_revision: _Optional[str] = ...) -> None: ...

class OpticsReading(_message.Message):
    __slots__ = ("identity", "temperature_c", "voltage_v", "tx_bias_ma", "tx_power_dbm", "rx_power_dbm", "thresholds", "flags")
    class ThresholdsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Thresholds
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Thresholds, _Mapping]] = ...) -> None: ...
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    VOLTAGE_V_FIELD_NUMBER: _ClassVar[int]
    TX_BIAS_MA_FIELD_NUMBER: _ClassVar[int]
    TX_POWER_DBM_FIELD_NUMBER: _ClassVar[int]
    RX_POWER_DBM_FIELD_NUMBER: _ClassVar[int]
    THRESHOLDS_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    identity: ModuleIdentity
    temperature_c: float
    voltage_v: float
    tx_bias_ma: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Value]
    tx_power_dbm: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Value]
    rx_power_dbm: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Value]
    thresholds: _containers.MessageMap[str, Thresholds]
    flags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, identity: _Optional[_Union[ModuleIdentity, _Mapping]] = ..., temperature_c: _Optional[float] = ..., voltage_v: _Optional[float] = ..., tx_bias_ma: _Optional[_Iterable[_Union[_struct_pb2.Value, _Mapping]]] = ..., tx_power_dbm: _Optional[_Iterable[_Union[_struct_pb2.Value, _Mapping]]] = ..., rx_power_dbm: _Optional[_Iterable[_Union[_struct_pb2.Value, _Mapping]]] = ..., thresholds: _Optional[_Mapping[str, Thresholds]] = ..., flags: _Optional[_Iterable[str]] = ...) -> None: ...

class CounterSample(_message.Message):
    __slots__ = ("port", "rx_crc_errors", "symbol_errors", "length_errors", "rx_missed", "fec_corrected", "fec_uncorrectable", "link_down_events", "ext_state", "ext_substate")
    PORT_FIELD_NUMBER: _ClassVar[int]
    RX_CRC_ERRORS_FIELD_NUMBER: _ClassVar[int]
    SYMBOL_ERRORS_FIELD_NUMBER: _ClassVar[int]
    LENGTH_ERRORS_FIELD_NUMBER: _ClassVar[int]
    RX_MISSED_FIELD_NUMBER: _ClassVar[int]
    FEC_CORRECTED_FIELD_NUMBER: _ClassVar[int]
    FEC_UNCORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    LINK_DOWN_EVENTS_FIELD_NUMBER: _ClassVar[int]
    EXT_STATE_FIELD_NUMBER: _ClassVar[int]
    EXT_SUBSTATE_FIELD_NUMBER: _ClassVar[int]
    port: str
    rx_crc_errors: int
    symbol_errors: int
    length_errors: int
    rx_missed: int
    fec_corrected: int
    fec_uncorrectable: int
    link_down_events: int
    ext_state: str
    ext_substate: str
    def __init__(self, port: _Optional[str] = ..., rx_crc_errors: _Optional[int] = ..., symbol_errors: _Optional[int] = ..., length_errors: _Optional[int] = ..., rx_missed: _Optional[int] = ..., fec_corrected: _Optional[int] = ..., fec_uncorrectable: _Optional[int] = ..., link_down_events: _Optional[int] = ..., ext_state: _Optional[str] = ..., ext_substate: _Optional[str] = ...) -> None: ...

class Assessment(_message.Message):
    __slots__ = ("signal", "severity", "status", "detail", "confirmed", "direction", "one_way", "witnesses")
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    ONE_WAY_FIELD_NUMBER: _ClassVar[int]
    WITNESSES_FIELD_NUMBER: _ClassVar[int]
    signal: str
    severity: Verdict
    status: str
    detail: str
    confirmed: bool
    direction: str
    one_way: OneWayDelay
    witnesses: int
    def __init__(self, signal: _Optional[str] = ..., severity: _Optional[_Union[Verdict, str]] = ..., status: _Optional[str] = ..., detail: _Optional[str] = ..., confirmed: _Optional[bool] = ..., direction: _Optional[str] = ..., one_way: _Optional[_Union[OneWayDelay, _Mapping]] = ..., witnesses: _Optional[int] = ...) -> None: ...

class OneWayDelay(_message.Message):
    __slots__ = ("towards_s", "back_s", "bound_s", "clocks", "refused", "samples")
    TOWARDS_S_FIELD_NUMBER: _ClassVar[int]
    BACK_S_FIELD_NUMBER: _ClassVar[int]
    BOUND_S_FIELD_NUMBER: _ClassVar[int]
    CLOCKS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    towards_s: float
    back_s: float
    bound_s: float
    clocks: str
    refused: str
    samples: int
    def __init__(self, towards_s: _Optional[float] = ..., back_s: _Optional[float] = ..., bound_s: _Optional[float] = ..., clocks: _Optional[str] = ..., refused: _Optional[str] = ..., samples: _Optional[int] = ...) -> None: ...

class PortSensors(_message.Message):
    __slots__ = ("port", "optics", "optics_unreadable", "counters", "assessments")
    PORT_FIELD_NUMBER: _ClassVar[int]
    OPTICS_FIELD_NUMBER: _ClassVar[int]
    OPTICS_UNREADABLE_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    ASSESSMENTS_FIELD_NUMBER: _ClassVar[int]
    port: str
    optics: OpticsReading
    optics_unreadable: str
    counters: CounterSample
    assessments: _containers.RepeatedCompositeFieldContainer[Assessment]
    def __init__(self, port: _Optional[str] = ..., optics: _Optional[_Union[OpticsReading, _Mapping]] = ..., optics_unreadable: _Optional[str] = ..., counters: _Optional[_Union[CounterSample, _Mapping]] = ..., assessments: _Optional[_Iterable[_Union[Assessment, _Mapping]]] = ...) -> None: ...

class DaemonStatus(_message.Message):
    __slots__ = ("hostname", "version", "config_source", "started_at", "ports", "links", "rails", "groups", "reconciles", "netlink_writes", "last_reconcile_at", "last_error", "served_at", "boot_id", "last_event_seq", "aggregator", "sensors", "problems", "last_error_at", "reconcile_failures", "responder")
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
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_EVENT_SEQ_FIELD_NUMBER: _ClassVar[int]
    AGGREGATOR_FIELD_NUMBER: _ClassVar[int]
    SENSORS_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_AT_FIELD_NUMBER: _ClassVar[int]
    RECONCILE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    RESPONDER_FIELD_NUMBER: _ClassVar[int]
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
    boot_id: str
    last_event_seq: int
    aggregator: AggregatorLink
    sensors: _containers.RepeatedCompositeFieldContainer[PortSensors]
    problems: _containers.RepeatedCompositeFieldContainer[Problem]
    last_error_at: float
    reconcile_failures: int
    responder: ResponderCounters
    def __init__(self, hostname: _Optional[str] = ..., version: _Optional[str] = ..., config_source: _Optional[str] = ..., started_at: _Optional[float] = ..., ports: _Optional[_Iterable[_Union[PortState, _Mapping]]] = ..., links: _Optional[_Iterable[_Union[LinkSample, _Mapping]]] = ..., rails: _Optional[_Iterable[_Union[RailStatus, _Mapping]]] = ..., groups: _Optional[_Iterable[_Union[GroupStatus, _Mapping]]] = ..., reconciles: _Optional[int] = ..., netlink_writes: _Optional[int] = ..., last_reconcile_at: _Optional[float] = ..., last_error: _Optional[str] = ..., served_at: _Optional[float] = ..., boot_id: _Optional[str] = ..., last_event_seq: _Optional[int] = ..., aggregator: _Optional[_Union[AggregatorLink, _Mapping]] = ..., sensors: _Optional[_Iterable[_Union[PortSensors, _Mapping]]] = ..., problems: _Optional[_Iterable[_Union[Problem, _Mapping]]] = ..., last_error_at: _Optional[float] = ..., reconcile_failures: _Optional[int] = ..., responder: _Optional[_Union[ResponderCounters, _Mapping]] = ...) -> None: ...

class AggregatorLink(_message.Message):
    __slots__ = ("host_id", "address", "connected", "refused", "last_status", "last_error", "connected_at", "last_failure_at", "last_ack_at", "spool_events", "spool_bytes", "events_sent", "events_acked", "events_dropped")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    LAST_STATUS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_FAILURE_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_ACK_AT_FIELD_NUMBER: _ClassVar[int]
    SPOOL_EVENTS_FIELD_NUMBER: _ClassVar[int]
    SPOOL_BYTES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_SENT_FIELD_NUMBER: _ClassVar[int]
    EVENTS_ACKED_FIELD_NUMBER: _ClassVar[int]
    EVENTS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    address: str
    connected: bool
    refused: bool
    last_status: str
    last_error: str
    connected_at: float
    last_failure_at: float
    last_ack_at: float
    spool_events: int
    spool_bytes: int
    events_sent: int
    events_acked: int
    events_dropped: int
    def __init__(self, host_id: _Optional[str] = ..., address: _Optional[str] = ..., connected: _Optional[bool] = ..., refused: _Optional[bool] = ..., last_status: _Optional[str] = ..., last_error: _Optional[str] = ..., connected_at: _Optional[float] = ..., last_failure_at: _Optional[float] = ..., last_ack_at: _Optional[float] = ..., spool_events: _Optional[int] = ..., spool_bytes: _Optional[int] = ..., events_sent: _Optional[int] = ..., events_acked: _Optional[int] = ..., events_dropped: _Optional[int] = ...) -> None: ...

class ResponderCounters(_message.Message):
    __slots__ = ("answered", "refused_address", "refused_source", "rate_limited", "malformed")
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_SOURCE_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMITED_FIELD_NUMBER: _ClassVar[int]
    MALFORMED_FIELD_NUMBER: _ClassVar[int]
    answered: int
    refused_address: int
    refused_source: int
    rate_limited: int
    malformed: int
    def __init__(self, answered: _Optional[int] = ..., refused_address: _Optional[int] = ..., refused_source: _Optional[int] = ..., rate_limited: _Optional[int] = ..., malformed: _Optional[int] = ...) -> None: ...

class Problem(_message.Message):
    __slots__ = ("kind", "what", "detail", "since", "attempts")
    KIND_FIELD_NUMBER: _ClassVar[int]
    WHAT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    what: str
    detail: str
    since: float
    attempts: int
    def __init__(self, kind: _Optional[str] = ..., what: _Optional[str] = ..., detail: _Optional[str] = ..., since: _Optional[float] = ..., attempts: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("port", "rails", "link", "state", "sensors")
    PORT_FIELD_NUMBER: _ClassVar[int]
    RAILS_FIELD_NUMBER: _ClassVar[int]
    LINK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SENSORS_FIELD_NUMBER: _ClassVar[int]
    port: str
    rails: _containers.RepeatedScalarFieldContainer[str]
    link: LinkSample
    state: PortState
    sensors: PortSensors
    def __init__(self, port: _Optional[str] = ..., rails: _Optional[_Iterable[str]] = ..., link: _Optional[_Union[LinkSample, _Mapping]] = ..., state: _Optional[_Union[PortState, _Mapping]] = ..., sensors: _Optional[_Union[PortSensors, _Mapping]] = ...) -> None: ...

class ListLinksResponse(_message.Message):
    __slots__ = ("links", "served_at")
    LINKS_FIELD_NUMBER: _ClassVar[int]
    SERVED_AT_FIELD_NUMBER: _ClassVar[int]
    links: _containers.RepeatedCompositeFieldContainer[Link]
    served_at: float
    def __init__(self, links: _Optional[_Iterable[_Union[Link, _Mapping]]] = ..., served_at: _Optional[float] = ...) -> None: ...

class ExplainPortRequest(_message.Message):
    __slots__ = ("port",)
    PORT_FIELD_NUMBER: _ClassVar[int]
    port: str
    def __init__(self, port: _Optional[str] = ...) -> None: ...

class Consequence(_message.Message):
    __slots__ = ("kind", "name", "table", "role", "carries_port", "detail")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CARRIES_PORT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    table: int
    role: str
    carries_port: bool
    detail: str
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., table: _Optional[int] = ..., role: _Optional[str] = ..., carries_port: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...

class ExplainPortResponse(_message.Message):
    __slots__ = ("port", "rail", "state", "consequences", "summary", "paths", "served_at")
    PORT_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CONSEQUENCES_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    SERVED_AT_FIELD_NUMBER: _ClassVar[int]
    port: str
    rail: str
    state: PortState
    consequences: _containers.RepeatedCompositeFieldContainer[Consequence]
    summary: str
    paths: _containers.RepeatedCompositeFieldContainer[Assessment]
    served_at: float
    def __init__(self, port: _Optional[str] = ..., rail: _Optional[str] = ..., state: _Optional[_Union[PortState, _Mapping]] = ..., consequences: _Optional[_Iterable[_Union[Consequence, _Mapping]]] = ..., summary: _Optional[str] = ..., paths: _Optional[_Iterable[_Union[Assessment, _Mapping]]] = ..., served_at: _Optional[float] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("boot_id", "seq", "time", "monotonic_s", "kind", "severity", "name", "port", "rail", "message", "fields")
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    MONOTONIC_S_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    boot_id: str
    seq: int
    time: _timestamp_pb2.Timestamp
    monotonic_s: float
    kind: EventKind
    severity: Severity
    name: str
    port: str
    rail: str
    message: str
    fields: _containers.ScalarMap[str, str]
    def __init__(self, boot_id: _Optional[str] = ..., seq: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., monotonic_s: _Optional[float] = ..., kind: _Optional[_Union[EventKind, str]] = ..., severity: _Optional[_Union[Severity, str]] = ..., name: _Optional[str] = ..., port: _Optional[str] = ..., rail: _Optional[str] = ..., message: _Optional[str] = ..., fields: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListEventsRequest(_message.Message):
    __slots__ = ("after_seq", "limit", "boot_id")
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    limit: int
    boot_id: str
    def __init__(self, after_seq: _Optional[int] = ..., limit: _Optional[int] = ..., boot_id: _Optional[str] = ...) -> None: ...

class ListEventsResponse(_message.Message):
    __slots__ = ("events", "missed", "boot_id", "last_seq")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    MISSED_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    missed: int
    boot_id: str
    last_seq: int
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., missed: _Optional[int] = ..., boot_id: _Optional[str] = ..., last_seq: _Optional[int] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("after_seq", "boot_id")
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    boot_id: str
    def __init__(self, after_seq: _Optional[int] = ..., boot_id: _Optional[str] = ...) -> None: ...

class WatchEventsResponse(_message.Message):
    __slots__ = ("event", "missed")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    MISSED_FIELD_NUMBER: _ClassVar[int]
    event: Event
    missed: int
    def __init__(self, event: _Optional[_Union[Event, _Mapping]] = ..., missed: _Optional[int] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("port", "reason", "duration_s")
    PORT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    port: str
    reason: str
    duration_s: float
    def __init__(self, port: _Optional[str] = ..., reason: _Optional[str] = ..., duration_s: _Optional[float] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("state", "replaced", "notes")
    STATE_FIELD_NUMBER: _ClassVar[int]
    REPLACED_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    state: PortState
    replaced: DrainInfo
    notes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, state: _Optional[_Union[PortState, _Mapping]] = ..., replaced: _Optional[_Union[DrainInfo, _Mapping]] = ..., notes: _Optional[_Iterable[str]] = ...) -> None: ...

class UndrainRequest(_message.Message):
    __slots__ = ("port",)
    PORT_FIELD_NUMBER: _ClassVar[int]
    port: str
    def __init__(self, port: _Optional[str] = ...) -> None: ...

class UndrainResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: PortState
    def __init__(self, state: _Optional[_Union[PortState, _Mapping]] = ...) -> None: ...

class FenceInfo(_message.Message):
    __slots__ = ("port", "rail", "state", "reason", "since", "until", "backoff_s", "held", "fences", "summary")
    PORT_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_S_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    FENCES_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    port: str
    rail: str
    state: str
    reason: str
    since: float
    until: float
    backoff_s: float
    held: str
    fences: int
    summary: str
    def __init__(self, port: _Optional[str] = ..., rail: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., since: _Optional[float] = ..., until: _Optional[float] = ..., backoff_s: _Optional[float] = ..., held: _Optional[str] = ..., fences: _Optional[int] = ..., summary: _Optional[str] = ...) -> None: ...

class ListFencesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListFencesResponse(_message.Message):
    __slots__ = ("enabled", "fences", "require_leaf_grant", "max_fenced")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    FENCES_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_LEAF_GRANT_FIELD_NUMBER: _ClassVar[int]
    MAX_FENCED_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    fences: _containers.RepeatedCompositeFieldContainer[FenceInfo]
    require_leaf_grant: bool
    max_fenced: int
    def __init__(self, enabled: _Optional[bool] = ..., fences: _Optional[_Iterable[_Union[FenceInfo, _Mapping]]] = ..., require_leaf_grant: _Optional[bool] = ..., max_fenced: _Optional[int] = ...) -> None: ...

class UnfenceRequest(_message.Message):
    __slots__ = ("port", "hold_s")
    PORT_FIELD_NUMBER: _ClassVar[int]
    HOLD_S_FIELD_NUMBER: _ClassVar[int]
    port: str
    hold_s: float
    def __init__(self, port: _Optional[str] = ..., hold_s: _Optional[float] = ...) -> None: ...

class UnfenceResponse(_message.Message):
    __slots__ = ("fence",)
    FENCE_FIELD_NUMBER: _ClassVar[int]
    fence: FenceInfo
    def __init__(self, fence: _Optional[_Union[FenceInfo, _Mapping]] = ...) -> None: ...

class WatchHealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PortHealth(_message.Message):
    __slots__ = ("port", "rail", "rdma_device", "rdma_port", "verdict", "since", "reason", "drained", "usable")
    PORT_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    RDMA_DEVICE_FIELD_NUMBER: _ClassVar[int]
    RDMA_PORT_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    USABLE_FIELD_NUMBER: _ClassVar[int]
    port: str
    rail: str
    rdma_device: str
    rdma_port: int
    verdict: Verdict
    since: _timestamp_pb2.Timestamp
    reason: str
    drained: bool
    usable: bool
    def __init__(self, port: _Optional[str] = ..., rail: _Optional[str] = ..., rdma_device: _Optional[str] = ..., rdma_port: _Optional[int] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ..., drained: _Optional[bool] = ..., usable: _Optional[bool] = ...) -> None: ...

class WatchHealthResponse(_message.Message):
    __slots__ = ("hostname", "boot_id", "generation", "written_at", "valid_until", "ports")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_AT_FIELD_NUMBER: _ClassVar[int]
    VALID_UNTIL_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    boot_id: str
    generation: int
    written_at: _timestamp_pb2.Timestamp
    valid_until: _timestamp_pb2.Timestamp
    ports: _containers.RepeatedCompositeFieldContainer[PortHealth]
    def __init__(self, hostname: _Optional[str] = ..., boot_id: _Optional[str] = ..., generation: _Optional[int] = ..., written_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., valid_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ports: _Optional[_Iterable[_Union[PortHealth, _Mapping]]] = ...) -> None: ...
