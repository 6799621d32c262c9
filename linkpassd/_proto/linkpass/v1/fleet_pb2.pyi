import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from linkpassd._proto.linkpass.v1 import control_pb2 as _control_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ConnectRequest(_message.Message):
    __slots__ = ("hello", "inventory", "ports", "events", "heartbeat", "command_result")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    COMMAND_RESULT_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    inventory: Inventory
    ports: PortReport
    events: EventBatch
    heartbeat: Heartbeat
    command_result: CommandResult
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., inventory: _Optional[_Union[Inventory, _Mapping]] = ..., ports: _Optional[_Union[PortReport, _Mapping]] = ..., events: _Optional[_Union[EventBatch, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., command_result: _Optional[_Union[CommandResult, _Mapping]] = ...) -> None: ...

class ConnectResponse(_message.Message):
    __slots__ = ("welcome", "ack", "peers", "command", "fence")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    ack: EventAck
    peers: ProbePeers
    command: Command
    fence: FenceGrants
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., ack: _Optional[_Union[EventAck, _Mapping]] = ..., peers: _Optional[_Union[ProbePeers, _Mapping]] = ..., command: _Optional[_Union[Command, _Mapping]] = ..., fence: _Optional[_Union[FenceGrants, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("host_id", "boot_id", "version")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    boot_id: str
    version: str
    def __init__(self, host_id: _Optional[str] = ..., boot_id: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("heartbeat_s", "stored", "max_message_bytes")
    HEARTBEAT_S_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    heartbeat_s: float
    stored: _containers.RepeatedCompositeFieldContainer[EventAck]
    max_message_bytes: int
    def __init__(self, heartbeat_s: _Optional[float] = ..., stored: _Optional[_Iterable[_Union[EventAck, _Mapping]]] = ..., max_message_bytes: _Optional[int] = ...) -> None: ...

class Inventory(_message.Message):
    __slots__ = ("rails",)
    RAILS_FIELD_NUMBER: _ClassVar[int]
    rails: _containers.RepeatedCompositeFieldContainer[RailInventory]
    def __init__(self, rails: _Optional[_Iterable[_Union[RailInventory, _Mapping]]] = ...) -> None: ...

class RailInventory(_message.Message):
    __slots__ = ("rail", "port", "address", "gateway", "rdma_device", "rdma_port", "gpus", "leaf")
    RAIL_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    RDMA_DEVICE_FIELD_NUMBER: _ClassVar[int]
    RDMA_PORT_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    LEAF_FIELD_NUMBER: _ClassVar[int]
    rail: str
    port: str
    address: str
    gateway: str
    rdma_device: str
    rdma_port: int
    gpus: int
    leaf: str
    def __init__(self, rail: _Optional[str] = ..., port: _Optional[str] = ..., address: _Optional[str] = ..., gateway: _Optional[str] = ..., rdma_device: _Optional[str] = ..., rdma_port: _Optional[int] = ..., gpus: _Optional[int] = ..., leaf: _Optional[str] = ...) -> None: ...

class PortReport(_message.Message):
    __slots__ = ("ports", "paths", "rail_paths", "time")
    class RailPathsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PORTS_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    RAIL_PATHS_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    ports: _containers.RepeatedCompositeFieldContainer[_control_pb2.PortState]
    paths: _containers.RepeatedCompositeFieldContainer[PathState]
    rail_paths: _containers.ScalarMap[str, str]
    time: _timestamp_pb2.Timestamp
    def __init__(self, ports: _Optional[_Iterable[_Union[_control_pb2.PortState, _Mapping]]] = ..., paths: _Optional[_Iterable[_Union[PathState, _Mapping]]] = ..., rail_paths: _Optional[_Mapping[str, str]] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PathState(_message.Message):
    __slots__ = ("port", "peer", "state", "loss", "rtt_p50_us", "direction", "requests_lost", "replies_lost")
    PORT_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    RTT_P50_US_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_LOST_FIELD_NUMBER: _ClassVar[int]
    REPLIES_LOST_FIELD_NUMBER: _ClassVar[int]
    port: str
    peer: str
    state: str
    loss: float
    rtt_p50_us: int
    direction: str
    requests_lost: int
    replies_lost: int
    def __init__(self, port: _Optional[str] = ..., peer: _Optional[str] = ..., state: _Optional[str] = ..., loss: _Optional[float] = ..., rtt_p50_us: _Optional[int] = ..., direction: _Optional[str] = ..., requests_lost: _Optional[int] = ..., replies_lost: _Optional[int] = ...) -> None: ...

class EventBatch(_message.Message):
    __slots__ = ("boot_id", "events", "gap_first", "gap_last")
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    GAP_FIRST_FIELD_NUMBER: _ClassVar[int]
    GAP_LAST_FIELD_NUMBER: _ClassVar[int]
    boot_id: str
    events: _containers.RepeatedCompositeFieldContainer[_control_pb2.Event]
    gap_first: int
    gap_last: int
    def __init__(self, boot_id: _Optional[str] = ..., events: _Optional[_Iterable[_Union[_control_pb2.Event, _Mapping]]] = ..., gap_first: _Optional[int] = ..., gap_last: _Optional[int] = ...) -> None: ...

class EventAck(_message.Message):
    __slots__ = ("boot_id", "seq")
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    boot_id: str
    seq: int
    def __init__(self, boot_id: _Optional[str] = ..., seq: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("time", "spool_dropped", "spool_pending")
    TIME_FIELD_NUMBER: _ClassVar[int]
    SPOOL_DROPPED_FIELD_NUMBER: _ClassVar[int]
    SPOOL_PENDING_FIELD_NUMBER: _ClassVar[int]
    time: _timestamp_pb2.Timestamp
    spool_dropped: int
    spool_pending: int
    def __init__(self, time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., spool_dropped: _Optional[int] = ..., spool_pending: _Optional[int] = ...) -> None: ...

class FenceGrants(_message.Message):
    __slots__ = ("ports", "leaf_cap")
    PORTS_FIELD_NUMBER: _ClassVar[int]
    LEAF_CAP_FIELD_NUMBER: _ClassVar[int]
    ports: _containers.RepeatedScalarFieldContainer[str]
    leaf_cap: int
    def __init__(self, ports: _Optional[_Iterable[str]] = ..., leaf_cap: _Optional[int] = ...) -> None: ...

class ProbePeers(_message.Message):
    __slots__ = ("generation", "rails")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    RAILS_FIELD_NUMBER: _ClassVar[int]
    generation: int
    rails: _containers.RepeatedCompositeFieldContainer[RailPeers]
    def __init__(self, generation: _Optional[int] = ..., rails: _Optional[_Iterable[_Union[RailPeers, _Mapping]]] = ...) -> None: ...

class RailPeers(_message.Message):
    __slots__ = ("rail", "peers", "probed_by")
    RAIL_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    PROBED_BY_FIELD_NUMBER: _ClassVar[int]
    rail: str
    peers: _containers.RepeatedScalarFieldContainer[str]
    probed_by: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, rail: _Optional[str] = ..., peers: _Optional[_Iterable[str]] = ..., probed_by: _Optional[_Iterable[str]] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("id", "drain", "undrain", "validate", "by")
    ID_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    UNDRAIN_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    id: str
    drain: FleetDrainRequest
    undrain: FleetUndrainRequest
    validate: ValidateHost
    by: str
    def __init__(self, id: _Optional[str] = ..., drain: _Optional[_Union[FleetDrainRequest, _Mapping]] = ..., undrain: _Optional[_Union[FleetUndrainRequest, _Mapping]] = ..., validate: _Optional[_Union[ValidateHost, _Mapping]] = ..., by: _Optional[str] = ...) -> None: ...

class CommandResult(_message.Message):
    __slots__ = ("id", "code", "message", "validation")
    ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_FIELD_NUMBER: _ClassVar[int]
    id: str
    code: int
    message: str
    validation: HostValidation
    def __init__(self, id: _Optional[str] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., validation: _Optional[_Union[HostValidation, _Mapping]] = ...) -> None: ...

class ValidateHost(_message.Message):
    __slots__ = ("run_id", "duration_s", "ports", "targets", "rate_pps", "burst_pps", "burst_s", "probed_by", "flows")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    RATE_PPS_FIELD_NUMBER: _ClassVar[int]
    BURST_PPS_FIELD_NUMBER: _ClassVar[int]
    BURST_S_FIELD_NUMBER: _ClassVar[int]
    PROBED_BY_FIELD_NUMBER: _ClassVar[int]
    FLOWS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    duration_s: float
    ports: _containers.RepeatedCompositeFieldContainer[ExpectedPort]
    targets: _containers.RepeatedCompositeFieldContainer[ProbeTarget]
    rate_pps: float
    burst_pps: float
    burst_s: float
    probed_by: _containers.RepeatedCompositeFieldContainer[ProbeTarget]
    flows: int
    def __init__(self, run_id: _Optional[str] = ..., duration_s: _Optional[float] = ..., ports: _Optional[_Iterable[_Union[ExpectedPort, _Mapping]]] = ..., targets: _Optional[_Iterable[_Union[ProbeTarget, _Mapping]]] = ..., rate_pps: _Optional[float] = ..., burst_pps: _Optional[float] = ..., burst_s: _Optional[float] = ..., probed_by: _Optional[_Iterable[_Union[ProbeTarget, _Mapping]]] = ..., flows: _Optional[int] = ...) -> None: ...

class ExpectedPort(_message.Message):
    __slots__ = ("port", "rail", "speed_mbps", "switch_name", "switch_port")
    PORT_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    SPEED_MBPS_FIELD_NUMBER: _ClassVar[int]
    SWITCH_NAME_FIELD_NUMBER: _ClassVar[int]
    SWITCH_PORT_FIELD_NUMBER: _ClassVar[int]
    port: str
    rail: str
    speed_mbps: int
    switch_name: str
    switch_port: str
    def __init__(self, port: _Optional[str] = ..., rail: _Optional[str] = ..., speed_mbps: _Optional[int] = ..., switch_name: _Optional[str] = ..., switch_port: _Optional[str] = ...) -> None: ...

class ProbeTarget(_message.Message):
    __slots__ = ("rail", "peer", "peer_host")
    RAIL_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    PEER_HOST_FIELD_NUMBER: _ClassVar[int]
    rail: str
    peer: str
    peer_host: str
    def __init__(self, rail: _Optional[str] = ..., peer: _Optional[str] = ..., peer_host: _Optional[str] = ...) -> None: ...

class HostValidation(_message.Message):
    __slots__ = ("run_id", "ports", "pairs", "problems", "notes")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    ports: _containers.RepeatedCompositeFieldContainer[PortCheck]
    pairs: _containers.RepeatedCompositeFieldContainer[PairResult]
    problems: _containers.RepeatedScalarFieldContainer[str]
    notes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., ports: _Optional[_Iterable[_Union[PortCheck, _Mapping]]] = ..., pairs: _Optional[_Iterable[_Union[PairResult, _Mapping]]] = ..., problems: _Optional[_Iterable[str]] = ..., notes: _Optional[_Iterable[str]] = ...) -> None: ...

class PortCheck(_message.Message):
    __slots__ = ("port", "rail", "carrier", "speed_mbps", "lldp_system", "lldp_port", "lldp_source", "optics_problems", "counters_rising")
    class CountersRisingEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    PORT_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    CARRIER_FIELD_NUMBER: _ClassVar[int]
    SPEED_MBPS_FIELD_NUMBER: _ClassVar[int]
    LLDP_SYSTEM_FIELD_NUMBER: _ClassVar[int]
    LLDP_PORT_FIELD_NUMBER: _ClassVar[int]
    LLDP_SOURCE_FIELD_NUMBER: _ClassVar[int]
    OPTICS_PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_RISING_FIELD_NUMBER: _ClassVar[int]
    port: str
    rail: str
    carrier: bool
    speed_mbps: int
    lldp_system: str
    lldp_port: str
    lldp_source: str
    optics_problems: _containers.RepeatedScalarFieldContainer[str]
    counters_rising: _containers.ScalarMap[str, int]
    def __init__(self, port: _Optional[str] = ..., rail: _Optional[str] = ..., carrier: _Optional[bool] = ..., speed_mbps: _Optional[int] = ..., lldp_system: _Optional[str] = ..., lldp_port: _Optional[str] = ..., lldp_source: _Optional[str] = ..., optics_problems: _Optional[_Iterable[str]] = ..., counters_rising: _Optional[_Mapping[str, int]] = ...) -> None: ...

class PairResult(_message.Message):
    __slots__ = ("rail", "peer", "peer_host", "sent", "received", "rtt_p50_us", "rtt_p99_us", "burst_sent", "burst_received", "flows", "flows_silent", "requests_lost", "replies_lost", "receipts")
    RAIL_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    PEER_HOST_FIELD_NUMBER: _ClassVar[int]
    SENT_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    RTT_P50_US_FIELD_NUMBER: _ClassVar[int]
    RTT_P99_US_FIELD_NUMBER: _ClassVar[int]
    BURST_SENT_FIELD_NUMBER: _ClassVar[int]
    BURST_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    FLOWS_FIELD_NUMBER: _ClassVar[int]
    FLOWS_SILENT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_LOST_FIELD_NUMBER: _ClassVar[int]
    REPLIES_LOST_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    rail: str
    peer: str
    peer_host: str
    sent: int
    received: int
    rtt_p50_us: int
    rtt_p99_us: int
    burst_sent: int
    burst_received: int
    flows: int
    flows_silent: int
    requests_lost: int
    replies_lost: int
    receipts: bool
    def __init__(self, rail: _Optional[str] = ..., peer: _Optional[str] = ..., peer_host: _Optional[str] = ..., sent: _Optional[int] = ..., received: _Optional[int] = ..., rtt_p50_us: _Optional[int] = ..., rtt_p99_us: _Optional[int] = ..., burst_sent: _Optional[int] = ..., burst_received: _Optional[int] = ..., flows: _Optional[int] = ..., flows_silent: _Optional[int] = ..., requests_lost: _Optional[int] = ..., replies_lost: _Optional[int] = ..., receipts: _Optional[bool] = ...) -> None: ...

class ValidateRequest(_message.Message):
    __slots__ = ("plan", "hosts", "rails", "duration_s")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    RAILS_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    plan: _containers.RepeatedCompositeFieldContainer[PlannedPort]
    hosts: _containers.RepeatedScalarFieldContainer[str]
    rails: _containers.RepeatedScalarFieldContainer[str]
    duration_s: float
    def __init__(self, plan: _Optional[_Iterable[_Union[PlannedPort, _Mapping]]] = ..., hosts: _Optional[_Iterable[str]] = ..., rails: _Optional[_Iterable[str]] = ..., duration_s: _Optional[float] = ...) -> None: ...

class PlannedPort(_message.Message):
    __slots__ = ("host", "port", "switch_name", "switch_port", "rail", "speed_mbps")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    SWITCH_NAME_FIELD_NUMBER: _ClassVar[int]
    SWITCH_PORT_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    SPEED_MBPS_FIELD_NUMBER: _ClassVar[int]
    host: str
    port: str
    switch_name: str
    switch_port: str
    rail: str
    speed_mbps: int
    def __init__(self, host: _Optional[str] = ..., port: _Optional[str] = ..., switch_name: _Optional[str] = ..., switch_port: _Optional[str] = ..., rail: _Optional[str] = ..., speed_mbps: _Optional[int] = ...) -> None: ...

class ValidateResponse(_message.Message):
    __slots__ = ("progress", "report")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    progress: ValidateProgress
    report: ValidationReport
    def __init__(self, progress: _Optional[_Union[ValidateProgress, _Mapping]] = ..., report: _Optional[_Union[ValidationReport, _Mapping]] = ...) -> None: ...

class ValidateProgress(_message.Message):
    __slots__ = ("hosts_done", "hosts_total", "last_host")
    HOSTS_DONE_FIELD_NUMBER: _ClassVar[int]
    HOSTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LAST_HOST_FIELD_NUMBER: _ClassVar[int]
    hosts_done: int
    hosts_total: int
    last_host: str
    def __init__(self, hosts_done: _Optional[int] = ..., hosts_total: _Optional[int] = ..., last_host: _Optional[str] = ...) -> None: ...

class ValidationReport(_message.Message):
    __slots__ = ("run_id", "started", "finished", "hosts", "findings", "loss_resolution")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    LOSS_RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    started: _timestamp_pb2.Timestamp
    finished: _timestamp_pb2.Timestamp
    hosts: _containers.RepeatedCompositeFieldContainer[HostValidationResult]
    findings: _containers.RepeatedCompositeFieldContainer[Finding]
    loss_resolution: float
    def __init__(self, run_id: _Optional[str] = ..., started: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., hosts: _Optional[_Iterable[_Union[HostValidationResult, _Mapping]]] = ..., findings: _Optional[_Iterable[_Union[Finding, _Mapping]]] = ..., loss_resolution: _Optional[float] = ...) -> None: ...

class HostValidationResult(_message.Message):
    __slots__ = ("host_id", "status", "validation")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    status: str
    validation: HostValidation
    def __init__(self, host_id: _Optional[str] = ..., status: _Optional[str] = ..., validation: _Optional[_Union[HostValidation, _Mapping]] = ...) -> None: ...

class Finding(_message.Message):
    __slots__ = ("kind", "component", "hosts", "ports", "rail", "evidence", "confidence", "fix")
    KIND_FIELD_NUMBER: _ClassVar[int]
    COMPONENT_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    RAIL_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    FIX_FIELD_NUMBER: _ClassVar[int]
    kind: str
    component: str
    hosts: _containers.RepeatedScalarFieldContainer[str]
    ports: _containers.RepeatedScalarFieldContainer[str]
    rail: str
    evidence: _containers.RepeatedScalarFieldContainer[str]
    confidence: float
    fix: str
    def __init__(self, kind: _Optional[str] = ..., component: _Optional[str] = ..., hosts: _Optional[_Iterable[str]] = ..., ports: _Optional[_Iterable[str]] = ..., rail: _Optional[str] = ..., evidence: _Optional[_Iterable[str]] = ..., confidence: _Optional[float] = ..., fix: _Optional[str] = ...) -> None: ...

class GetValidationReportRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetValidationReportResponse(_message.Message):
    __slots__ = ("report",)
    REPORT_FIELD_NUMBER: _ClassVar[int]
    report: ValidationReport
    def __init__(self, report: _Optional[_Union[ValidationReport, _Mapping]] = ...) -> None: ...

class ListHostsRequest(_message.Message):
    __slots__ = ("host_ids",)
    HOST_IDS_FIELD_NUMBER: _ClassVar[int]
    host_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, host_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class HostView(_message.Message):
    __slots__ = ("host_id", "boot_id", "version", "connected", "last_seen", "rails", "report", "last_seq", "events_lost")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    RAILS_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    EVENTS_LOST_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    boot_id: str
    version: str
    connected: bool
    last_seen: _timestamp_pb2.Timestamp
    rails: _containers.RepeatedCompositeFieldContainer[RailInventory]
    report: PortReport
    last_seq: int
    events_lost: int
    def __init__(self, host_id: _Optional[str] = ..., boot_id: _Optional[str] = ..., version: _Optional[str] = ..., connected: _Optional[bool] = ..., last_seen: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., rails: _Optional[_Iterable[_Union[RailInventory, _Mapping]]] = ..., report: _Optional[_Union[PortReport, _Mapping]] = ..., last_seq: _Optional[int] = ..., events_lost: _Optional[int] = ...) -> None: ...

class ListHostsResponse(_message.Message):
    __slots__ = ("hosts", "served_at")
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    SERVED_AT_FIELD_NUMBER: _ClassVar[int]
    hosts: _containers.RepeatedCompositeFieldContainer[HostView]
    served_at: _timestamp_pb2.Timestamp
    def __init__(self, hosts: _Optional[_Iterable[_Union[HostView, _Mapping]]] = ..., served_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class FleetEvent(_message.Message):
    __slots__ = ("host_id", "id", "event", "stored_at")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    STORED_AT_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    id: int
    event: _control_pb2.Event
    stored_at: _timestamp_pb2.Timestamp
    def __init__(self, host_id: _Optional[str] = ..., id: _Optional[int] = ..., event: _Optional[_Union[_control_pb2.Event, _Mapping]] = ..., stored_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListFleetEventsRequest(_message.Message):
    __slots__ = ("host_id", "port", "kind", "since", "until", "after_id", "limit")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    AFTER_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    port: str
    kind: _control_pb2.EventKind
    since: _timestamp_pb2.Timestamp
    until: _timestamp_pb2.Timestamp
    after_id: int
    limit: int
    def __init__(self, host_id: _Optional[str] = ..., port: _Optional[str] = ..., kind: _Optional[_Union[_control_pb2.EventKind, str]] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., after_id: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ListFleetEventsResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[FleetEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[FleetEvent, _Mapping]]] = ...) -> None: ...

class WatchFleetEventsRequest(_message.Message):
    __slots__ = ("host_id", "port", "kind", "after_id")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    AFTER_ID_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    port: str
    kind: _control_pb2.EventKind
    after_id: int
    def __init__(self, host_id: _Optional[str] = ..., port: _Optional[str] = ..., kind: _Optional[_Union[_control_pb2.EventKind, str]] = ..., after_id: _Optional[int] = ...) -> None: ...

class WatchFleetEventsResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: FleetEvent
    def __init__(self, event: _Optional[_Union[FleetEvent, _Mapping]] = ...) -> None: ...

class FleetDrainRequest(_message.Message):
    __slots__ = ("host_id", "port", "reason", "duration_s")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    port: str
    reason: str
    duration_s: float
    def __init__(self, host_id: _Optional[str] = ..., port: _Optional[str] = ..., reason: _Optional[str] = ..., duration_s: _Optional[float] = ...) -> None: ...

class FleetDrainResponse(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class FleetUndrainRequest(_message.Message):
    __slots__ = ("host_id", "port")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    port: str
    def __init__(self, host_id: _Optional[str] = ..., port: _Optional[str] = ...) -> None: ...

class FleetUndrainResponse(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class GetSummaryRequest(_message.Message):
    __slots__ = ("days",)
    DAYS_FIELD_NUMBER: _ClassVar[int]
    days: int
    def __init__(self, days: _Optional[int] = ...) -> None: ...

class DaySummary(_message.Message):
    __slots__ = ("day", "failures_absorbed", "gpu_hours_saved", "failures_outgoing_only")
    DAY_FIELD_NUMBER: _ClassVar[int]
    FAILURES_ABSORBED_FIELD_NUMBER: _ClassVar[int]
    GPU_HOURS_SAVED_FIELD_NUMBER: _ClassVar[int]
    FAILURES_OUTGOING_ONLY_FIELD_NUMBER: _ClassVar[int]
    day: str
    failures_absorbed: int
    gpu_hours_saved: float
    failures_outgoing_only: int
    def __init__(self, day: _Optional[str] = ..., failures_absorbed: _Optional[int] = ..., gpu_hours_saved: _Optional[float] = ..., failures_outgoing_only: _Optional[int] = ...) -> None: ...

class GetSummaryResponse(_message.Message):
    __slots__ = ("days", "restart_cost_s", "hosts", "hosts_connected", "ports_by_verdict")
    class PortsByVerdictEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    DAYS_FIELD_NUMBER: _ClassVar[int]
    RESTART_COST_S_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    HOSTS_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    PORTS_BY_VERDICT_FIELD_NUMBER: _ClassVar[int]
    days: _containers.RepeatedCompositeFieldContainer[DaySummary]
    restart_cost_s: float
    hosts: int
    hosts_connected: int
    ports_by_verdict: _containers.ScalarMap[str, int]
    def __init__(self, days: _Optional[_Iterable[_Union[DaySummary, _Mapping]]] = ..., restart_cost_s: _Optional[float] = ..., hosts: _Optional[int] = ..., hosts_connected: _Optional[int] = ..., ports_by_verdict: _Optional[_Mapping[str, int]] = ...) -> None: ...
