"""Frozen value types shared by the pure core and the adapters.

Adapters normalise kernel objects into these types at the edge (names, not
ifindexes; CIDR strings, not byte blobs), so the core can compare observed and
desired state with plain equality.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

# --------------------------------------------------------------------------
# Configuration (built and validated by linkpassd.config; consumed by policy)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Ownership:
    """The kernel objects linkpassd may create, change and delete."""

    route_protocol: int = 201
    table_min: int = 10100
    table_max: int = 10199
    rule_priority_min: int = 10100
    rule_priority_max: int = 10199
    nexthop_id_min: int = 1_000_100
    nexthop_id_max: int = 1_000_199

    def owns_table(self, table: int) -> bool:
        return self.table_min <= table <= self.table_max

    def owns_rule_priority(self, priority: int) -> bool:
        return self.rule_priority_min <= priority <= self.rule_priority_max

    def owns_nexthop_id(self, nh_id: int) -> bool:
        return self.nexthop_id_min <= nh_id <= self.nexthop_id_max


@dataclass(frozen=True)
class Timers:
    rise: int = 3
    fall: int = 1
    hold_down_s: float = 5.0
    tick_interval_s: float = 0.5
    resync_interval_s: float = 30.0


@dataclass(frozen=True)
class HealthPolicy:
    """Thresholds and windows for counters, optics and flaps (core.signals)."""

    confirm: int = 3  # consecutive readings of a signal before it may degrade a port
    counter_window_s: float = 10.0
    crc_errors_per_s: float = 10.0
    symbol_errors_per_s: float = 10.0
    fec_uncorrectable_per_s: float = 1.0
    fec_corrected_per_s: float | None = None  # pre-FEC errors: off unless set
    rx_power_margin_db: float = 0.0  # added to the module's low warning level
    trend_window_s: float = 60.0
    trend_min_samples: int = 6
    trend_min_drop_db: float = 1.0
    predict_horizon_s: float = 120.0
    flap_penalty: float = 1000.0
    flap_half_life_s: float = 15.0
    flap_suppress: float = 2500.0
    flap_reuse: float = 800.0
    flap_max_penalty: float = 10000.0


@dataclass(frozen=True)
class SensorConfig:
    """Where counters and optics come from, and how often they are read."""

    backend: str = "ethtool"  # "ethtool" (the kernel) or "sim" (lab files)
    sim_dir: str = "/run/linkpass/sim"  # for "sim"; the config default is <run_dir>/sim
    counters_interval_s: float = 1.0
    optics_interval_s: float = 2.0


@dataclass(frozen=True)
class RailConfig:
    """One NIC port ("rail") with its own source address and routing table."""

    name: str
    port: str
    address: str  # host address on the rail, e.g. "198.18.0.1"
    prefixlen: int  # prefix length of the rail subnet, e.g. 24
    gateway: str  # next hop on the rail (the leaf switch)
    table: int
    backups: tuple[str, ...] = ()  # rail names, in order of preference
    destinations: tuple[str, ...] = ("0.0.0.0/0",)
    bfd: bool = False  # single-hop BFD session with `gateway`
    probe_peers: tuple[str, ...] = ()  # peer daemons' addresses, echo-probed from this rail
    probe_table: int | None = None  # keeps the rail's own path for probes (probing enabled)
    gpus: int = 1  # GPUs whose traffic the port carries (the aggregator's savings)
    leaf: str = ""  # the leaf switch the port is cabled to ("": unknown; the probe mesh)


@dataclass(frozen=True)
class AnnounceSettings:
    """``[announce]``: the host's rail addresses announced through FRR
    (core.announce; config.schema has the help)."""

    enabled: bool = False
    table: int = 250
    route_protocol: int = 202
    metric_base: int = 1000
    owner_med: int = 100
    settle_s: float = 1.0
    settle_community: str = "no-export"
    local_asn: int = 0  # for the FRR snippet only; 0: not set
    peer_asn: int = 0
    frr_run_dir: str = "/var/run/frr"


@dataclass(frozen=True)
class FenceSettings:
    """``[fence]``: taking a confirmed-failed port down administratively
    (core.fence; config.schema has the help, docs/fencing.md the why)."""

    enabled: bool = False
    fence_after_s: float = 5.0
    backoff_initial_s: float = 30.0
    backoff_max_s: float = 600.0
    test_window_s: float = 3.0
    test_timeout_s: float = 15.0
    max_fenced: int = 1
    lift_hold_s: float = 600.0
    require_leaf_grant: bool = True
    min_echo_peers: int = 2


@dataclass(frozen=True)
class BfdSettings:
    interval_ms: int = 300
    detect_mult: int = 3


@dataclass(frozen=True)
class ProbeSettings:
    """UDP echo probing between linkpassd peers (core.probe has the semantics)."""

    enabled: bool = False
    port: int = 4793
    interval_ms: float = 50.0
    tolerance_ms: float = 30.0
    suspect_ms: float = 3.0
    confirm_probes: int = 8
    rise: int = 3
    loss_window: int = 200
    max_loss_ratio: float = 0.20
    clear_loss_ratio: float = 0.10
    tos: int = 0
    lag_heartbeat_ms: float = 25.0
    fabric_prefixes: tuple[str, ...] = ()  # sources answered besides the probe peers
    responder_rate_pps: float = 5000.0  # per source
    responder_burst: int = 1000
    # Where this host's clock error bound comes from, for one-way delay
    # (core.oneway): "auto", "chrony", "ptp4l", "none" or "shared" (labs).
    clock: str = "auto"


@dataclass(frozen=True)
class AggregatorSettings:
    """Where linkpassd reports to (linkpass-aggregator) and how: the agent's
    stream. Absent from the config: standalone."""

    # Replicas of one aggregator (HOST:PORT or unix:/path), in the order the
    # agent tries them; it moves to the next when a stream ends or a connect
    # fails (agent.client). Never empty.
    addresses: tuple[str, ...]
    host_id: str = ""  # "": the host name (the agent reads it when it connects)
    ca: str = ""  # PEM files for mutual TLS; all three unless `insecure`
    cert: str = ""
    key: str = ""
    insecure: bool = False  # plaintext, labs only
    spool_max_events: int = 100_000  # unacknowledged events kept on disk; the oldest go first

    def __post_init__(self) -> None:
        # A bare string would pass as a tuple of one-character "addresses".
        if isinstance(self.addresses, str) or not self.addresses:
            raise ValueError(f"addresses must be a non-empty tuple of addresses, "
                             f"not {self.addresses!r}")

    @property
    def address(self) -> str:
        """The first address: the one tried first (logs and labs that know one)."""
        return self.addresses[0]


@dataclass(frozen=True)
class MultipathConfig:
    """A destination spread over several rails through a resilient nexthop group."""

    name: str
    destination: str  # CIDR
    rails: tuple[str, ...]  # in order of preference
    table: int
    buckets: int = 64
    idle_timer_s: int = 0
    unbalanced_timer_s: int = 0
    min_paths: int = 1  # capacity floor: never fewer members while ports can carry them


@dataclass(frozen=True)
class Config:
    rails: tuple[RailConfig, ...]
    multipath: tuple[MultipathConfig, ...] = ()
    ownership: Ownership = field(default_factory=Ownership)
    timers: Timers = field(default_factory=Timers)
    health: HealthPolicy = field(default_factory=HealthPolicy)
    sensors: SensorConfig = field(default_factory=SensorConfig)
    bfd: BfdSettings = field(default_factory=BfdSettings)
    probes: ProbeSettings = field(default_factory=ProbeSettings)
    announce: AnnounceSettings = field(default_factory=AnnounceSettings)
    fence: FenceSettings = field(default_factory=FenceSettings)
    roce_rules: bool = True
    # Tables the config file left to linkpassd, by core.alloc's table keys
    # ("rail:NAME", "probe:NAME", "group:NAME"). The builder fills them in as
    # a fresh start would; the daemon keeps them stable by name across reloads
    # and restarts through its allocation (core.alloc.resolve).
    auto_tables: frozenset[str] = frozenset()
    control_socket: str = "/run/linkpass/linkpassd.sock"
    run_dir: str = "/run/linkpass"
    state_dir: str = "/var/lib/linkpass"
    log_format: str = "kv"
    log_level: str = "info"
    control_group: str = "linkpass"  # may read over the control socket
    admin_group: str = ""  # may also drain/undrain; root always may
    event_buffer: int = 2048
    metrics_listen: str = ""  # "" : no metrics endpoint
    aggregator: AggregatorSettings | None = None  # None: standalone
    source: str = "<memory>"  # the file this came from, for messages

    def rail(self, name: str) -> RailConfig:
        for rail in self.rails:
            if rail.name == name:
                return rail
        raise KeyError(name)


# --------------------------------------------------------------------------
# Samples and verdicts
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkSample:
    """What netlink says about one interface at one moment."""

    port: str
    present: bool
    ifindex: int = 0
    admin_up: bool = False
    carrier: bool = False
    operstate: str = "UNKNOWN"
    carrier_up_count: int = 0
    carrier_down_count: int = 0

    @property
    def healthy(self) -> bool:
        return self.present and self.admin_up and self.carrier

    @staticmethod
    def missing(port: str) -> "LinkSample":
        return LinkSample(port=port, present=False)


class Verdict(enum.StrEnum):
    UP = "UP"
    DEGRADED = "DEGRADED"
    DOWN = "DOWN"


@dataclass(frozen=True)
class PortState:
    """The health verdict of one port, and whether the kernel would accept a
    nexthop on it right now (carrier up), which is not the same thing: a port
    in hold-down has carrier but is not yet trusted."""

    port: str
    verdict: Verdict
    carrier: bool
    phase: str  # the health state machine's state, e.g. "RECOVERING"
    since: float  # when the verdict last changed: daemon clock in the core, unix time in DaemonStatus
    evidence: tuple[str, ...] = ()
    drain: "Drain | None" = None  # set while an operator has the port drained
    # While RECOVERING: when the hold-down ends (same clock as `since`); 0
    # otherwise. The verdict changes then if the rise count is also met.
    hold_until: float = 0.0


@dataclass(frozen=True)
class Drain:
    """An operator's drain of a port (see core.drain).  Times are unix time:
    the intent outlives the daemon and its monotonic clock."""

    port: str
    reason: str
    by: str  # who asked: "root (uid 0)", or "alice (uid 1000)"
    at: float  # unix time it began
    until: float | None = None  # unix time it ends by itself; None: until undrained

    def describe(self, show_time: Callable[[float], str] | None = None) -> str:
        """'drained by alice (uid 1000): optic swap'; with `show_time` (how
        the caller shows a time to people), the end too: '... (until <time>)'.
        The core never turns a time into text itself (the zone is the
        adapters' business): evidence carries no time, the drain does."""
        text = f"drained by {self.by}: {self.reason}"
        if show_time is None:
            return text
        return f"{text} (until {'undrained' if self.until is None else show_time(self.until)})"


@dataclass(frozen=True)
class DrainOutcome:
    """What a drain did, for the operator who asked: the port's state after
    the pass, the drain this one replaced (the newest drain of a port wins,
    its --for included), and why traffic is still on the port, if it is."""

    state: PortState
    replaced: Drain | None = None
    notes: tuple[str, ...] = ()


# --------------------------------------------------------------------------
# Optics (module EEPROM) and interface counters
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Thresholds:
    """A module's own alarm and warning levels for one quantity (None: not given)."""

    high_alarm: float | None = None
    high_warn: float | None = None
    low_warn: float | None = None
    low_alarm: float | None = None


@dataclass(frozen=True)
class ModuleIdentity:
    spec: str  # "SFF-8472", "SFF-8636" or "CMIS"
    form_factor: str  # e.g. "SFP/SFP+/SFP28", "QSFP28", "QSFP-DD", "OSFP"
    vendor: str
    part: str
    serial: str
    revision: str = ""
    spec_revision: str = ""  # e.g. "5.0" for CMIS


@dataclass(frozen=True)
class OpticsReading:
    """Decoded module diagnostics (DOM). Powers in dBm, bias in mA; a lane's
    value is None when the module does not report it."""

    identity: ModuleIdentity
    temperature_c: float | None = None
    voltage_v: float | None = None
    tx_bias_ma: tuple[float | None, ...] = ()
    tx_power_dbm: tuple[float | None, ...] = ()
    rx_power_dbm: tuple[float | None, ...] = ()
    # keyed by "temperature_c", "voltage_v", "tx_bias_ma", "tx_power_dbm", "rx_power_dbm"
    thresholds: tuple[tuple[str, Thresholds], ...] = ()
    # the module's own latched flags, e.g. "rx_power_low_alarm[2]", "tx_fault[0]", "rx_los[1]"
    flags: frozenset[str] = frozenset()

    def threshold(self, quantity: str) -> Thresholds:
        return dict(self.thresholds).get(quantity, Thresholds())


@dataclass(frozen=True)
class Unreadable:
    """A sensor answer that cannot be trusted (truncated, garbage, contradictory):
    a verdict of its own, never an exception."""

    reason: str


@dataclass(frozen=True)
class CounterSample:
    """Monotonic interface counters as read (None: not supported by the driver).
    Health works on their rates over windows, never on totals."""

    port: str
    rx_crc_errors: int | None = None
    symbol_errors: int | None = None
    length_errors: int | None = None
    rx_missed: int | None = None
    fec_corrected: int | None = None
    fec_uncorrectable: int | None = None
    link_down_events: int | None = None  # ETHTOOL_A_LINKSTATE_EXT_DOWN_CNT
    ext_state: str | None = None  # why the link is down, when it is
    ext_substate: str | None = None


@dataclass(frozen=True)
class OneWayDelay:
    """A path's one-way delays (core.oneway): medians over its recent
    replies, each within +-`bound_s`; or, with `refused` set, why they are
    not reported (the delays are then None)."""

    towards_s: float | None = None  # our request's way to the peer
    back_s: float | None = None  # the peer's reply's way back
    bound_s: float | None = None  # our clock's bound plus the peer's
    clocks: str = ""  # where the bounds come from, e.g. "shared", "chrony +-12 us here, ..."
    refused: str = ""  # why not reported ("" when reported)
    samples: int = 0  # replies the medians are over


@dataclass(frozen=True)
class Assessment:
    """One signal's judgement of a port (core.signals)."""

    signal: str  # "counters", "optics", "flaps"
    severity: Verdict | None  # None: no opinion
    status: str  # "ok", "degraded", "unreadable", "unsupported", "warming up", "suppressed"
    detail: str = ""
    confirmed: bool = True  # severity has held for `confirm` readings
    # A path probe's: which way it loses packets (core.direction.Direction's
    # values: "requests", "replies", "both", "none", "unknown"); "" for other signals.
    direction: str = ""
    # A path probe's one-way delays, or why none (core.oneway); None for
    # other signals.
    one_way: OneWayDelay | None = None
    # A rail's echo verdict: how many peers' paths it rests on (0 for other
    # signals). One far end cannot tell its own failure from ours
    # (core.fence.singled_out, `[fence] min_echo_peers`).
    witnesses: int = 0

    @property
    def effective(self) -> Verdict | None:
        return self.severity if self.confirmed else None


@dataclass(frozen=True)
class PortSensors:
    """The latest sensor readings of a port and how each signal judges them."""

    port: str
    optics: OpticsReading | None = None
    optics_unreadable: str = ""  # the reason, when the module could not be read
    counters: CounterSample | None = None
    assessments: tuple[Assessment, ...] = ()


# --------------------------------------------------------------------------
# Kernel objects linkpassd owns (IPv4)
# --------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Nexthop:
    id: int
    gateway: str
    port: str
    protocol: int


@dataclass(frozen=True, order=True)
class NexthopGroup:
    id: int
    members: tuple[int, ...]  # nexthop ids, sorted
    protocol: int
    resilient: bool = True
    buckets: int = 64
    idle_timer_s: int = 0
    unbalanced_timer_s: int = 0


@dataclass(frozen=True, order=True)
class Route:
    table: int
    dst: str  # CIDR, e.g. "0.0.0.0/0"
    nhid: int
    protocol: int
    prefsrc: str | None = None

    @property
    def key(self) -> tuple[int, str]:
        """Routes are replaced in place when their key matches."""
        return (self.table, self.dst)


@dataclass(frozen=True, order=True)
class Rule:
    priority: int
    table: int
    protocol: int
    src: str | None = None  # CIDR
    dst: str | None = None  # CIDR
    ipproto: int | None = None  # e.g. 17 for UDP
    dport: int | None = None
    sport: int | None = None


KernelObject = Nexthop | NexthopGroup | Route | Rule


@dataclass(frozen=True)
class KernelState:
    """The owned kernel objects: observed (from a dump) or desired (from policy)."""

    nexthops: frozenset[Nexthop] = frozenset()
    groups: frozenset[NexthopGroup] = frozenset()
    routes: frozenset[Route] = frozenset()
    rules: frozenset[Rule] = frozenset()


class OpKind(enum.StrEnum):
    CREATE = "create"
    REPLACE = "replace"
    DELETE = "delete"


@dataclass(frozen=True)
class Op:
    kind: OpKind
    obj: KernelObject

    def __str__(self) -> str:
        return f"{self.kind} {self.obj}"


@dataclass(frozen=True, order=True)
class ForeignObject:
    """A kernel object inside linkpassd's owned ranges that linkpassd did not
    make: another protocol, or (for a route) not through a nexthop object.
    linkpassd never changes or deletes it; it is reported because it can
    block what linkpassd wants to create there."""

    kind: str  # "nexthop", "group", "route" or "rule"
    protocol: int
    description: str  # one line, ip(8)-like, e.g. "route 198.19.1.0/24 table 10100 ..."
    id: int | None = None  # nexthop or group id
    table: int | None = None  # route table, or the rule's lookup table
    priority: int | None = None  # rule priority
    dst: str | None = None  # route destination, CIDR

    def __str__(self) -> str:
        return self.description


# --------------------------------------------------------------------------
# What the daemon reports (control API, logs)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class RailStatus:
    name: str
    port: str
    address: str
    table: int
    active_rail: str | None  # the rail whose path the table uses now; None: no path
    active_port: str | None


@dataclass(frozen=True)
class GroupStatus:
    name: str
    destination: str
    table: int
    members: tuple[str, ...]  # rail names currently in the group
    min_paths: int


@dataclass(frozen=True)
class DaemonStatus:
    hostname: str
    version: str
    config_source: str
    started_at: float  # unix time
    ports: tuple[PortState, ...]
    links: tuple[LinkSample, ...]
    rails: tuple[RailStatus, ...]
    groups: tuple[GroupStatus, ...]
    reconciles: int
    netlink_writes: int
    last_reconcile_at: float  # unix time, 0 when none yet
    last_error: str = ""
    sensors: tuple[PortSensors, ...] = ()
    problems: tuple["Problem", ...] = ()
    last_error_at: float = 0.0  # unix time; 0 when there is no error
    reconcile_failures: int = 0
    responder: "ResponderCounters | None" = None  # None: probing is off
    boot_id: str = ""  # this start of the daemon (core.events)
    last_event_seq: int = 0
    aggregator: "AgentLinkStatus | None" = None  # None: no [aggregator] (standalone)


@dataclass(frozen=True)
class AgentLinkStatus:
    """The agent's link to linkpass-aggregator (control proto AggregatorLink).
    Times are unix time, 0 for never."""

    host_id: str
    address: str
    connected: bool = False
    refused: bool = False  # the aggregator or the TLS handshake refused this host
    last_status: str = ""  # the last failure's gRPC status name; "" while connected
    last_error: str = ""
    connected_at: float = 0.0
    last_failure_at: float = 0.0
    last_ack_at: float = 0.0
    spool_events: int = 0
    spool_bytes: int = 0
    events_sent: int = 0
    events_acked: int = 0
    events_dropped: int = 0


@dataclass(frozen=True)
class ResponderCounters:
    """What the echo responder did with the datagrams it received since start."""

    answered: int = 0
    refused_address: int = 0  # sent to a local address that is no rail's
    refused_source: int = 0  # source neither in fabric_prefixes nor a probe peer
    rate_limited: int = 0  # over the source's responder_rate_pps
    malformed: int = 0  # not an echo packet, or a reply (never answered)


@dataclass(frozen=True)
class Problem:
    """Something the daemon cannot do right now (see the control proto)."""

    kind: str  # "conflict", "refused", "foreign", "bfd", "state"
    what: str
    detail: str
    since: float  # unix time
    attempts: int = 0
