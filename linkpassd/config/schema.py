"""The schema: every option of linkpassd's config, declared once with its
type, default, help text and checks. Validation (config.build) and the
reference documentation (config.reference) are both driven by it, so they
cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from linkpassd.config.checks import (
    BOOL,
    FLOAT,
    IFNAME,
    INT,
    IPV4_ADDRESS,
    IPV4_CIDR,
    IPV4_INTERFACE,
    NAME,
    NH_TIMER_MAX_S,
    NON_EMPTY,
    ROUTE_PROTOCOL,
    STR,
    STR_LIST,
    STR_OR_LIST,
    SUN_PATH_MAX,
    U32_MAX,
    UNIQUE,
    _abs_path,
    _at_least,
    _between,
    _bgp_community,
    _Check,
    _each,
    _empty_or,
    _greater_than,
    _group_name,
    _host_id,
    _host_port,
    _int_range,
    _label,
    _listen_address,
    _one_of,
    _one_or_list,
    _Type,
)
from linkpassd.core.oneway import CLOCK_SOURCES

# --------------------------------------------------------------------------
# The schema: every option, once
# --------------------------------------------------------------------------


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Option:
    key: str
    type: _Type
    default: Any  # REQUIRED, None (computed later, see default_doc), or the value
    help: str
    checks: tuple[_Check, ...] = ()
    default_doc: str | None = None  # how the reference shows a computed default

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass(frozen=True)
class Section:
    name: str
    array: bool  # [[name]] (array of tables) rather than [name]
    help: str
    options: tuple[Option, ...]
    rules: tuple[str, ...] = ()  # checks across options, for the reference
    switch: bool = False  # the section's presence turns its feature on (absent: off)

    def option(self, key: str) -> Option | None:
        return next((o for o in self.options if o.key == key), None)

    @property
    def header(self) -> str:
        return f"[[{self.name}]]" if self.array else f"[{self.name}]"


_U32 = _int_range(1, U32_MAX)

DAEMON = Section(
    "daemon",
    array=False,
    help="The daemon process itself.",
    options=(
        Option("control_socket", STR, "/run/linkpass/linkpassd.sock",
               "Unix socket of the local control API, used by `linkpassctl` (created mode 0660).",
               (_abs_path(SUN_PATH_MAX),)),
        Option("run_dir", STR, "/run/linkpass",
               "Directory for runtime state, such as the per-NIC `health.json` that launchers read "
               "to exclude bad NICs.",
               (_abs_path(),)),
        Option("state_dir", STR, "/var/lib/linkpass",
               "Directory for what must survive a restart: each port's verdict and its evidence "
               "(so a rail that failed over stays failed over until its own probes prove it "
               "healthy) and the allocated nexthop ids, rule priorities and tables (so a reload "
               "or restart never renumbers what is in use), the aggregator's last probe peers "
               "(`mesh.json`) and the unacknowledged events (`spool/`). systemd's "
               "`StateDirectory=linkpass`.",
               (_abs_path(),)),
        Option("log_format", STR, "kv",
               "Log line format: `kv` (logfmt: key=value, a value quoted when it needs to be) or "
               "`json`; one event per line either way. Under journald each line also carries "
               "its priority (`journalctl -p err`).",
               (_one_of("kv", "json"),)),
        Option("log_level", STR, "info", "Lowest level that is logged.",
               (_one_of("debug", "info", "warning", "error"),)),
        Option("control_group", STR, "linkpass",
               "Group of the control socket: its members may read (`linkpassctl status`, "
               "`events`, `links`, `explain`). If the group does not exist the socket stays "
               "root's alone, and the daemon says so at start.",
               (_group_name(),)),
        Option("admin_group", STR, "",
               "Members of this group may also change things (`linkpassctl drain`, `undrain`); "
               "root always may. Empty: root only. Checked against the caller's credentials on "
               "the socket (SO_PEERCRED), not the socket's permissions.",
               (_group_name(),)),
        Option("event_buffer", INT, 2048,
               "Events held in memory for `linkpassctl events` and the event stream; older ones "
               "are dropped, and a reader that falls that far behind is told how many it missed.",
               (_int_range(16, 1_000_000),)),
    ),
)

METRICS = Section(
    "metrics",
    array=False,
    help="Prometheus metrics over HTTP (`/metrics`). Off unless `listen` is set; keep it on a "
         "loopback address and let the node's scraper or exporter reach it there.",
    options=(
        Option("listen", STR, "",
               "Address to serve metrics on, e.g. `127.0.0.1:9469`; empty: no metrics.",
               (_listen_address(),)),
    ),
)

AGGREGATOR = Section(
    "aggregator",
    array=False,
    switch=True,
    help="Report to a linkpass-aggregator (the fleet view) over one gRPC stream: this host's "
         "rails, port and path state and every event, and take from it the probe mesh's echo "
         "peers and operators' drains. Absent: linkpassd runs standalone. Events wait in a "
         "bounded spool in `state_dir` while the aggregator is away and are sent when it is "
         "back; the host is protected the same either way. Certificates: "
         "`scripts/linkpass-certs` (docs/aggregator.md).",
    options=(
        Option("address", STR_OR_LIST, REQUIRED,
               "The aggregator's `HOST:PORT`, e.g. `agg.example:7443` (resolved at each "
               "connection attempt), or `unix:/abs/path` for one on this machine. Several "
               "replicas of one aggregator (on one shared store): an array, e.g. "
               "`[\"agg-1.example:7443\", \"agg-2.example:7443\"]`. linkpassd streams to one "
               "at a time, starting with the first; when its stream ends or a connection "
               "fails it moves to the next (round-robin) and sends again every event not yet "
               "acknowledged (the aggregator stores each once). The backoff between attempts "
               "grows with each full pass over the list that reached none of them.",
               (_one_or_list(_host_port(), "address"),)),
        Option("host_id", STR, "",
               "The name this host reports as; its certificate must name it. Empty: the "
               "system's host name.",
               (_host_id(),), default_doc="the system's host name"),
        Option("ca", STR, "", "PEM file of the CA that signed the aggregator's certificate.",
               (_empty_or(_abs_path()),)),
        Option("cert", STR, "", "PEM file of this host's certificate (mutual TLS).",
               (_empty_or(_abs_path()),)),
        Option("key", STR, "", "PEM file of this host's private key.",
               (_empty_or(_abs_path()),)),
        Option("insecure", BOOL, False,
               "Plaintext, no certificates: for labs only (linkpassd says so loudly at start)."),
        Option("spool_max_events", INT, 100_000,
               "Unacknowledged events kept on disk (`<state_dir>/spool`); past this the oldest "
               "are dropped, counted and reported to the aggregator as a gap.",
               (_int_range(100, 10_000_000),)),
    ),
    rules=(
        "`ca`, `cert` and `key` are all set, and readable, unless `insecure = true`",
        "`insecure = true` with any of `ca`, `cert`, `key` is refused (which one was meant?)",
    ),
)

OWNERSHIP = Section(
    "ownership",
    array=False,
    help="The kernel objects linkpassd owns. It creates, changes and deletes only routes, rules "
         "and nexthops tagged with `route_protocol` and inside these ranges, and leaves "
         "everything else alone, so keep them apart from other routing software on the host. "
         "Rule priorities and nexthop ids are allocated from their ranges by linkpassd.",
    options=(
        Option("route_protocol", INT, 201,
               "`rtm_protocol` tag on every route, rule and nexthop linkpassd installs. On start it "
               "adopts, and may delete, everything carrying this tag, so no other software may "
               "use it; the kernel's own values and those registered for routing daemons are "
               "refused.",
               (ROUTE_PROTOCOL,)),
        Option("table_min", INT, 10100, "First routing table id linkpassd may use.", (_U32,)),
        Option("table_max", INT, 10199,
               "Last routing table id linkpassd may use. The range needs one table per rail and "
               "one per multipath group.",
               (_U32,)),
        Option("rule_priority_min", INT, 10100, "First policy rule priority linkpassd may use.", (_U32,)),
        Option("rule_priority_max", INT, 10199,
               "Last policy rule priority linkpassd may use. The range needs one rule per rail "
               "(two with `routing.roce_rules`) and one per multipath group.",
               (_U32,)),
        Option("nexthop_id_min", INT, 1_000_100, "First nexthop object id linkpassd may use.", (_U32,)),
        Option("nexthop_id_max", INT, 1_000_199,
               "Last nexthop object id linkpassd may use. The range needs one id per rail and one "
               "per multipath group.",
               (_U32,)),
    ),
    rules=(
        "each `*_min` ≤ its `*_max`",
        "the table range must not include 253 (default), 254 (main) or 255 (local)",
        "the rule priority range must not include 32766 or 32767 (the main and default rules)",
        "each range must hold what the configured rails and multipath groups need",
    ),
)

TIMERS = Section(
    "timers",
    array=False,
    help="How fast a port is declared down and how cautiously it is trusted again. A false "
         "failover costs as much as a missed one, so recovery is deliberately slower than failure.",
    options=(
        Option("rise", INT, 3, "Consecutive good samples before a recovered port is trusted.",
               (_at_least(1),)),
        Option("fall", INT, 1, "Consecutive bad samples before a port is declared down.",
               (_at_least(1),)),
        Option("hold_down_s", FLOAT, 5.0,
               "Seconds a recovered port must stay healthy before traffic fails back to it.",
               (_at_least(0),)),
        Option("tick_interval_s", FLOAT, 0.5,
               "Seconds between health samples taken from cached link state.",
               (_greater_than(0),)),
        Option("resync_interval_s", FLOAT, 30.0,
               "Seconds between full re-reads of kernel state, even when no event arrived.",
               (_greater_than(0),)),
    ),
    rules=("`resync_interval_s` ≥ `tick_interval_s`",),
)

HEALTH = Section(
    "health",
    array=False,
    help="How counters, optics and flaps turn into a verdict. A signal degrades a port only "
         "after `confirm` consecutive readings agree; DEGRADED ports are drained while a healthy "
         "alternative exists. Optic thresholds are the module's own warning levels.",
    options=(
        Option("confirm", INT, 3,
               "Consecutive readings of a signal (optics readings, counter intervals) before it "
               "may degrade a port: one spiky reading drains nothing.", (_at_least(1),)),
        Option("counter_window_s", FLOAT, 10.0,
               "Seconds over which error counter rates are computed.", (_greater_than(0),)),
        Option("crc_errors_per_s", FLOAT, 10.0, "RX CRC (FCS) errors per second that degrade a port.",
               (_greater_than(0),)),
        Option("symbol_errors_per_s", FLOAT, 10.0, "Symbol errors per second that degrade a port.",
               (_greater_than(0),)),
        Option("fec_uncorrectable_per_s", FLOAT, 1.0,
               "Uncorrectable FEC blocks per second that degrade a port (each is lost data).",
               (_greater_than(0),)),
        Option("fec_corrected_per_s", FLOAT, 0.0,
               "Corrected FEC blocks per second that degrade a port (pre-FEC errors); 0 turns this "
               "check off, since healthy high-speed links correct errors all the time.",
               (_at_least(0),)),
        Option("rx_power_margin_db", FLOAT, 0.0,
               "dB added to the module's RX power low warning level before it degrades a port.",
               (_at_least(0),)),
        Option("trend_window_s", FLOAT, 60.0,
               "Seconds of RX power history used to see a decline coming.", (_greater_than(0),)),
        Option("trend_min_samples", INT, 6, "Readings needed before a trend is trusted.",
               (_at_least(3),)),
        Option("trend_min_drop_db", FLOAT, 1.0,
               "RX power must have fallen at least this much over the window to count as a trend.",
               (_greater_than(0),)),
        Option("predict_horizon_s", FLOAT, 120.0,
               "Drain a port whose RX power trend reaches the module's low alarm within this "
               "many seconds.", (_at_least(0),)),
        Option("flap_penalty", FLOAT, 1000.0, "Penalty added per carrier loss (flap dampening).",
               (_greater_than(0),)),
        Option("flap_half_life_s", FLOAT, 15.0, "Seconds for the flap penalty to halve.",
               (_greater_than(0),)),
        Option("flap_suppress", FLOAT, 2500.0,
               "Penalty at which a flapping port is kept DEGRADED beyond its hold-down.",
               (_greater_than(0),)),
        Option("flap_reuse", FLOAT, 800.0,
               "Penalty below which a suppressed port may be used again.", (_greater_than(0),)),
        Option("flap_max_penalty", FLOAT, 10000.0,
               "Cap on the penalty, which bounds how long a port stays suppressed.",
               (_greater_than(0),)),
    ),
    rules=("`flap_reuse` < `flap_suppress` ≤ `flap_max_penalty`",),
)

SENSORS = Section(
    "sensors",
    array=False,
    help="Where counters and optics are read from, and how often. `ethtool` reads the kernel "
         "(ethtool netlink, module EEPROM; a driver without a counter or module is normal); `sim` "
         "reads simulated files (labs; format in labs/simsensor.md).",
    options=(
        Option("backend", STR, "ethtool", "`ethtool` or `sim`.", (_one_of("ethtool", "sim"),)),
        Option("sim_dir", STR, None, "Directory of `<port>.json` files for the `sim` backend.",
               (_abs_path(),), default_doc="`<run_dir>/sim`"),
        Option("counters_interval_s", FLOAT, 1.0, "Seconds between counter reads.",
               (_greater_than(0),)),
        Option("optics_interval_s", FLOAT, 2.0,
               "Seconds between module EEPROM reads (one reader per module at a time).",
               (_greater_than(0),)),
    ),
)

BFD = Section(
    "bfd",
    array=False,
    help="BFD (RFC 5880/5881, single hop) with each rail's gateway where the rail sets "
         "`bfd = true`; interoperates with switch and FRR bfdd sessions. Detection takes "
         "`detect_mult` × the negotiated interval; a session that never came up, a peer that "
         "goes AdminDown, and a Down our own stalled event loop could explain are not path "
         "failures.",
    options=(
        Option("interval_ms", INT, 300,
               "Desired transmit and required receive interval once Up (FRR's default is 300; "
               "before Up, BFD slows to 1 s).", (_int_range(10, 60000),)),
        Option("detect_mult", INT, 3, "Missed packets before the session is declared Down.",
               (_int_range(1, 255),)),
    ),
)

PROBES = Section(
    "probes",
    array=False,
    help="UDP echo probes between linkpassd peers, end to end across the fabric: they see what "
         "carrier and single-hop BFD cannot (a blackholing spine, one-way loss upstream). "
         "Detection is a contract (docs/probing.md): no silence, delay or pause of a path "
         "shorter than `tolerance_ms` ever fails it over, on either end and under any CPU load; "
         "a silent blackhole is DOWN at most `interval_ms` + `tolerance_ms` + `suspect_ms` "
         "after it began. A probe unanswered for `suspect_ms` makes the path suspect, and it "
         "probes `confirm_probes` times over the tolerance, the last a tolerance after the "
         "first unanswered probe, until a reply comes or the silence has lasted the "
         "tolerance. Sustained "
         "random loss above `max_loss_ratio` makes the path DEGRADED. A rail is DOWN only when "
         "every peer that ever answered through it is unreachable (a dead peer host fails "
         "nothing), DEGRADED when most are bad. Peers that never answered count for nothing. "
         "With `enabled`, every daemon also answers its peers' probes, and each rail gets a "
         "probe table (`rail.probe_table`) and two rules that keep probes and replies on the "
         "rail's own path even while its traffic has failed over, so recovery is seen.",
    options=(
        Option("enabled", BOOL, False,
               "Answer peers' probes, pin probe traffic to each rail's own path, and probe the "
               "rails' `probe_peers`."),
        Option("port", INT, 4793,
               "UDP port of the echo responder, the same on every host (4793 sits next to the "
               "RoCEv2 ports and clear of BFD, VXLAN and the ephemeral range).",
               (_int_range(1, 65535),)),
        Option("interval_ms", FLOAT, 50.0, "Milliseconds between steady probes on each path.",
               (_between(1, 60000),)),
        Option("tolerance_ms", FLOAT, 30.0,
               "The longest silence, delay or pause of a path that must never fail it over "
               "(a PFC pause, a link retraining, a switch's hiccup). Above it, an outage is "
               "detected soon after the tolerance has passed (see the section's help). 30 ms: "
               "longer than the pauses a busy RoCE fabric shows, well inside NCCL's retry "
               "window (docs/probing.md has the measurements).", (_between(1, 60000),)),
        Option("suspect_ms", FLOAT, 3.0,
               "The reply wait: a probe still unanswered this long after it left makes the "
               "path suspect (confirmation probes start; a late reply ends the suspicion and "
               "costs nothing else). Round trips in one fabric are well under a millisecond.",
               (_greater_than(0),)),
        Option("confirm_probes", INT, 8,
               "Probes spread over the tolerance while a path is silent, all of which must go "
               "unanswered for DOWN (a path that already loses probes gets more, up to 32, so "
               "random loss fakes a DOWN at most once in 10^9 steady probes). At least 2: one "
               "would leave the probes a whole tolerance apart, and a gap over half the "
               "tolerance is time nobody looked.",
               (_int_range(2, 32),)),
        Option("rise", INT, 3,
               "On-time replies in a row before a path that was down (or never up) counts as up.",
               (_int_range(1, 1000),)),
        Option("loss_window", INT, 200, "Steady probes the loss ratio is measured over.",
               (_int_range(10, 100000),)),
        Option("max_loss_ratio", FLOAT, 0.20,
               "Share of steady probes lost above which a path is DEGRADED.", (_between(0.001, 1),)),
        Option("clear_loss_ratio", FLOAT, 0.10,
               "Share at or below which a DEGRADED path is healthy again.", (_between(0, 1),)),
        Option("tos", INT, 0,
               "IP TOS byte of probes, e.g. the RoCE traffic class's DSCP << 2 so that probes "
               "share its queue.", (_int_range(0, 255),)),
        Option("lag_heartbeat_ms", FLOAT, 25.0,
               "How often the event loop checks its own scheduling lag, so a stall of ours is "
               "not read as a dead path; 0 relies on the probes' own timers only.",
               (_between(0, 1000),)),
        Option("fabric_prefixes", STR_LIST, (),
               "Sources whose echo requests the responder answers, besides every rail's "
               "`probe_peers` (e.g. the fabric's host space, so peers that probe us need no "
               "config here). Empty: only configured probe peers get answers. Requests are "
               "answered only on rail addresses, never on loopback or management addresses.",
               (_each(IPV4_CIDR), UNIQUE)),
        Option("responder_rate_pps", FLOAT, 5000.0,
               "Requests per second answered per source address and prober id (token "
               "bucket; the id is the random one in every request, so a flood spoofing a "
               "peer's address cannot use up its real prober's rate); more are dropped and "
               "counted. One peer address probing us over 4 paths at 10 ms while each "
               "confirms a loss with 1 ms probes sends at most 4 x (100 + 1000) = 4400 per "
               "second, so the default never limits a peer.",
               (_between(1, 1e7),)),
        Option("responder_burst", INT, 1000,
               "Bucket size of `responder_rate_pps`: requests one source may send at once "
               "(4 paths each sending a 32-probe burst at 0 ms spacing is 128).",
               (_int_range(1, 1_000_000),)),
        Option("clock", STR, "auto",
               "Where this host's clock error bound comes from, for one-way delays per path "
               "(docs/probing.md): `chrony` (`chronyc -c tracking`), `ptp4l` (`pmc`, "
               "TIME_STATUS_NP), `auto` (chrony, else ptp4l), `none` (round trips only), or "
               "`shared`, for labs only: every peer shares this kernel's clock (network "
               "namespaces on one machine), bound 0. A path's one-way delays are reported "
               "only when both ends' clocks give a bound, within their sum; otherwise round "
               "trips only, and the status says why. The responder sends this bound to the "
               "peers that ask.", (_one_of(*CLOCK_SOURCES),)),
    ),
    rules=(
        "`suspect_ms` < `tolerance_ms`; `clear_loss_ratio` < `max_loss_ratio`",
        "`fabric_prefixes` may not contain a /0 (it would answer the whole internet)",
        "`rail.probe_peers` requires `enabled = true`",
    ),
)

ROUTING = Section(
    "routing",
    array=False,
    help="Routing behaviour shared by all rails.",
    options=(
        Option("roce_rules", BOOL, True,
               "Also add, per rail, a rule sending RoCEv2 (UDP destination port 4791) from the "
               "rail address to the rail table."),
    ),
)

ANNOUNCE = Section(
    "announce",
    array=False,
    help="Announce the host's rail addresses to the fabric through FRR on the host "
         "(docs/bgp.md): each rail address (/32) over its own rail's BGP session while the rail "
         "carries its own traffic, over the session of the rail that carries it otherwise, with "
         "the same hold-down as the routes. linkpassd writes the announcements as routes in "
         "`table`; FRR's zebra imports that table and bgpd announces it per rail "
         "(`python -m linkpassd.announce_frr CONFIG` prints that FRR config). Off by default.",
    options=(
        Option("enabled", BOOL, False, "Write announcements (and report FRR's state)."),
        Option("table", INT, 250,
               "Kernel table of the announcements, imported by FRR (`ip import-table`); never "
               "used for forwarding. Outside the owned table range and not 253, 254 or 255.",
               (_U32,)),
        Option("route_protocol", INT, 202,
               "`rtm_protocol` of the announcement routes; different from "
               "`ownership.route_protocol`.", (ROUTE_PROTOCOL,)),
        Option("metric_base", INT, 1000,
               "Route metric of an announcement over the first rail; rail N (in config order) "
               "uses `metric_base` + N. FRR's per-rail route-maps match it.",
               (_int_range(1, U32_MAX - 4096),)),
        Option("owner_med", INT, 100,
               "MED of an address announced over its own rail's session; over another rail's "
               "session (a detour) the MED is 0, so that a switch still holding a usable own-rail "
               "announcement from a session that cannot carry the withdrawal (a gray failure "
               "the leaf does not see) prefers the detour (docs/bgp.md).",
               (_int_range(1, U32_MAX),)),
        Option("settle_s", FLOAT, 1.0,
               "Seconds a detoured address stays announced over the detour rail's session with "
               "NO_EXPORT when its own rail is trusted again, before it goes back to its own "
               "session: the detour's leaf keeps delivering it while the rest of the fabric "
               "forgets the detour, so the way back has no routing loop (docs/bgp.md). 0: "
               "straight back.",
               (_at_least(0),)),
        Option("settle_community", STR, "no-export",
               "The BGP community FRR sets on a settling announcement. `no-export`: the "
               "detour's leaf keeps it and passes it on to nobody. A community the fabric's "
               "spines hold back from the leaves (they keep the detour, the owner's leaf drops "
               "it first) also avoids the loop between a spine and the owner's leaf "
               "(docs/bgp.md; the lab's fabric does that with 64512:1).",
               (_bgp_community(),)),
        Option("local_asn", INT, 0,
               "The host's AS number, for the printed FRR config only (0: not set).",
               (_int_range(0, U32_MAX),)),
        Option("peer_asn", INT, 0,
               "The leaves' AS number, for the printed FRR config only (0: each session "
               "accepts any external AS, `remote-as external`, as when every rail's leaf has "
               "its own AS).",
               (_int_range(0, U32_MAX),)),
        Option("frr_run_dir", STR, "/var/run/frr",
               "Where FRR keeps its pid files (zebra.pid, bgpd.pid): how linkpassd tells whether "
               "FRR is running.", (_abs_path(),)),
    ),
    rules=(
        "`table` outside the owned table range",
        "`route_protocol` is not `ownership.route_protocol`",
    ),
)

FENCE = Section(
    "fence",
    array=False,
    help="Fencing (docs/fencing.md): a port DOWN with carrier (a failure the leaf cannot see: "
         "probes or BFD say the rail is dead while the link is up) for `fence_after_s` is set "
         "administratively down, so the leaf loses carrier and every RDMA queue pair on the NIC "
         "fails at once, and the collective layer moves them now (NCCL port failover, or a "
         "restart from health.json). After a backoff the port is brought up for a test while the "
         "routes stay away, and the fence ends only when the port's own probes say UP. Never the "
         "last healthy rail; at most `max_fenced` ports per host. Off by default.",
    options=(
        Option("enabled", BOOL, False, "Fence ports whose failure is confirmed."),
        Option("fence_after_s", FLOAT, 5.0,
               "Seconds a port must stay DOWN with carrier, counted from its DOWN verdict (so "
               "after the detection), before it is fenced. Well below NCCL's IB retry budget at "
               "its defaults (tens of seconds), well above any hiccup the probes tolerate.",
               (_between(0.5, 3600),)),
        Option("backoff_initial_s", FLOAT, 30.0,
               "Seconds a fenced port stays down before its first test.",
               (_between(1, 86400),)),
        Option("backoff_max_s", FLOAT, 600.0,
               "The backoff doubles after each failed test, up to this; a port fenced again "
               "within this long of its last fence's end keeps the doubled backoff.",
               (_between(1, 86400),)),
        Option("test_window_s", FLOAT, 3.0,
               "Seconds the port's own probes (echo, BFD) must say UP without a break, while it "
               "is up for a test, before the fence ends.",
               (_between(0.1, 3600),)),
        Option("test_timeout_s", FLOAT, 15.0,
               "Seconds a test may last; without the proof by then the port goes down again "
               "with the backoff doubled. More than `test_window_s`.",
               (_between(0.2, 7200),)),
        Option("max_fenced", INT, 1,
               "Ports this host may hold fenced (down or in a test) at once.",
               (_int_range(1, 64),)),
        Option("lift_hold_s", FLOAT, 600.0,
               "After `linkpassctl unfence` (or a release because no other rail was healthy), "
               "seconds the port is not fenced again unless it was trusted (UP) in between.",
               (_between(1, 366 * 86400),)),
        Option("require_leaf_grant", BOOL, True,
               "Fence only with the aggregator's grant for the port's leaf (a cap per leaf across "
               "hosts, linkpass-aggregator's `[fence] leaf_cap`, so that a leaf failure does not "
               "fence every host's port). Without a stream to the aggregator (or without "
               "`[aggregator]`) nothing is fenced then; the rail's `leaf` must be set "
               "(docs/fencing.md). false: the host's own checks (`max_fenced`, never the last "
               "healthy rail) decide alone."),
        Option("min_echo_peers", INT, 2,
               "Echo evidence fences a port only when its paths to at least this many peers are "
               "all down: paths to one peer cannot tell that peer's failure from this port's (a "
               "host whose only peer on a rail is blackholed sees what the blackholed host sees). "
               "A single-hop BFD session with the leaf down always counts. 1 only when the "
               "rail's one echo peer is the leaf itself.",
               (_int_range(1, 64),)),
    ),
    rules=(
        "`backoff_initial_s` ≤ `backoff_max_s`; `test_window_s` < `test_timeout_s`",
        "`test_timeout_s` < `backoff_initial_s` (a test is shorter than the wait before it)",
        "`enabled = true` needs a probe on every rail: `[probes] enabled` or `bfd` on each rail",
        "with `bfd` on any rail, `test_timeout_s` ≥ `test_window_s` + 2 (a fenced port's BFD "
        "session comes back up at 1 packet/s: up to 2 s)",
    ),
)

RAIL = Section(
    "rail",
    array=True,
    help="One NIC port (a \"rail\") with its own source address and routing table: traffic from "
         "the rail address is looked up in the rail table, and when the port fails that table "
         "is pointed at the first healthy backup rail. At least one `[[rail]]` is required.",
    options=(
        Option("name", STR, REQUIRED,
               "Name used in logs, metrics, `backups` and `multipath.rails`; unique.", (NAME,)),
        Option("port", STR, REQUIRED, "Network interface of the rail, e.g. `eth0`; unique.",
               (IFNAME,)),
        Option("address", STR, REQUIRED,
               "Host address on the rail with the subnet's prefix length, e.g. `198.18.0.1/24`; "
               "unique. IPv4 only for now.",
               (IPV4_INTERFACE,)),
        Option("gateway", STR, REQUIRED,
               "Next hop on the rail (the leaf switch); inside the rail subnet.", (IPV4_ADDRESS,)),
        Option("table", INT, None,
               "Routing table of the rail: inside the owned table range and not used twice. Left "
               "out, linkpassd picks one and keeps it for this rail's name across reloads and "
               "restarts (`allocation.json` in `state_dir`).",
               (_U32,),
               default_doc="lowest free table of the owned range (on a first start, in rail order)"),
        Option("backups", STR_LIST, (),
               "Other rails whose paths this rail's table uses when its own port is down, in "
               "order of preference.",
               (UNIQUE,)),
        Option("destinations", STR_LIST, ("0.0.0.0/0",),
               "Destinations routed in the rail table.",
               (NON_EMPTY, _each(IPV4_CIDR), UNIQUE)),
        Option("bfd", BOOL, False,
               "Run a single-hop BFD session with `gateway` (the leaf switch) on this port; a "
               "session that was up and goes down takes the port DOWN (timers in `[bfd]`)."),
        Option("probe_peers", STR_LIST, (),
               "Addresses of peer linkpassd hosts (their address on the same rail) to echo-probe "
               "from this rail's address and port (`[probes]`). Each must lie in one of the "
               "rail's `destinations` and outside the rail subnet.",
               (_each(IPV4_ADDRESS), UNIQUE)),
        Option("probe_table", INT, None,
               "Routing table that keeps the rail's own path for probes and replies, used when "
               "`[probes] enabled`: inside the owned table range and not used twice.",
               (_U32,),
               default_doc="lowest free table (on a first start, after the rails' and groups' "
                           "tables), kept by rail name"),
        Option("gpus", INT, 1,
               "GPUs whose traffic this port carries, for the aggregator's count of GPU-hours "
               "a failover saved.",
               (_int_range(0, 1024),)),
        Option("leaf", STR, "",
               "The leaf switch this port is cabled to, e.g. `leaf-a07`, for the aggregator's "
               "probe mesh (it picks echo peers under other leaves). Empty: unknown.",
               (_label(),)),
    ),
    rules=(
        "`name`, `port` and the host part of `address` are unique across rails",
        "`gateway` is inside the subnet of `address` and is not the address itself",
        "`backups` name other configured rails, not the rail itself",
        "`probe_peers` lie in `destinations`, outside the rail subnet, and are no rail's address",
    ),
)

MULTIPATH = Section(
    "multipath",
    array=True,
    help="A destination spread over several rails through a kernel resilient nexthop group "
         "(Linux ≥ 5.13): removing a failed path remaps only that path's flows.",
    options=(
        Option("name", STR, REQUIRED, "Name used in logs and metrics; unique among groups.",
               (NAME,)),
        Option("destination", STR, REQUIRED,
               "Destination routed through the group; unique. Not `0.0.0.0/0`: the group's rule "
               "would take every packet bound to no rail away from the main table.",
               (IPV4_CIDR,)),
        Option("rails", STR_LIST, REQUIRED, "Member rails, in order of preference.",
               (NON_EMPTY, UNIQUE)),
        Option("table", INT, None,
               "Routing table of the group: inside the owned table range and not used twice.",
               (_U32,),
               default_doc="lowest free table (on a first start, after the rails' tables), kept by "
                           "group name"),
        Option("buckets", INT, 64,
               "Hash buckets of the resilient group; at least the number of rails. The kernel "
               "cannot change it on an existing group.",
               (_int_range(1, 65535),)),
        Option("idle_timer_s", INT, 0,
               "Seconds a bucket must be idle before it may move to rebalance the group; 0 "
               "counts every bucket as idle.",
               (_int_range(0, NH_TIMER_MAX_S),)),
        Option("unbalanced_timer_s", INT, 0,
               "Seconds the group may stay unbalanced before busy buckets are moved anyway; 0 "
               "never forces a move.",
               (_int_range(0, NH_TIMER_MAX_S),)),
        Option("min_paths", INT, 1,
               "Capacity floor: linkpassd never shrinks the group below this many members while "
               "their ports can carry traffic.",
               (_at_least(1),)),
    ),
    rules=(
        "`rails` name configured rails",
        "`min_paths` ≤ number of `rails`; `buckets` ≥ number of `rails`",
    ),
)

SCHEMA: tuple[Section, ...] = (DAEMON, METRICS, AGGREGATOR, OWNERSHIP, TIMERS, HEALTH, SENSORS, BFD, PROBES, ROUTING,
                               ANNOUNCE, FENCE, RAIL, MULTIPATH)
