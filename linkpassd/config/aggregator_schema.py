"""The option table of linkpass-aggregator's config (`/etc/linkpass/aggregator.toml`):
every option declared once, with its type, default, help text and checks, on
the same Option/Section machinery as linkpassd's SCHEMA. Validation
(aggregator.settings, through config.build.validate_sections) and the
reference (docs/aggregator-config.md, config.reference) are both driven by it.
"""

from __future__ import annotations

from typing import Any

from linkpassd.config.checks import (
    BOOL,
    FLOAT,
    INT,
    NON_EMPTY,
    STR,
    _between,
    _dsn,
    _int_range,
    _one_of,
    _printable,
    _server_listen,
)
from linkpassd.config.schema import Option, Section

AGGREGATOR_DEFAULT_PATH = "/etc/linkpass/aggregator.toml"

_TEXT = _printable()
_FILE = (NON_EMPTY, _TEXT)

SERVER = Section(
    "aggregator",
    array=False,
    help="The gRPC service that hosts report to and operators query, and where it keeps "
         "the fleet's events.",
    options=(
        Option("listen", STR, "0.0.0.0:7443",
               "gRPC address for agents and operators: `HOST:PORT` (`[::]:7443` for IPv6; port "
               "0: any free port), or `unix:/abs/path`, a Unix socket (labs: daemons in network "
               "namespaces reach it through the file system).",
               (_TEXT, _server_listen(optional=False, unix=True))),
        Option("store", STR, "sqlite",
               "`sqlite` (one process, the `database` file) or `postgresql` (replicas sharing "
               "one database, docs/aggregator.md \"A PostgreSQL store\").",
               (_one_of("sqlite", "postgresql"),)),
        Option("database", STR, "/var/lib/linkpass-aggregator/fleet.db",
               "The SQLite file (its directory must exist); unused with `store = \"postgresql\"`.",
               _FILE),
        Option("postgresql_dsn", STR, "",
               "With `store = \"postgresql\"` (required then, refused otherwise): the database "
               "the replicas share, e.g. `postgresql://linkpass@db.example/linkpass` or, over a "
               "Unix socket, `postgresql://linkpass@/linkpass?host=/run/postgresql`. Errors and "
               "logs show it without its password.",
               (_dsn(),)),
        Option("retention_days", INT, 30, "Events older than this many days are deleted.",
               (_int_range(1, 3650),)),
        Option("restart_cost_min", FLOAT, 30.0,
               "What a job restart costs per GPU, in minutes: the GPU-hours a failover saved "
               "are counted with it.",
               (_between(0, 7 * 24 * 60),)),
        Option("heartbeat_s", FLOAT, 5.0, "The agents' heartbeat interval, told in Welcome.",
               (_between(0.5, 300),)),
        Option("max_message_bytes", INT, 4 * 1024 * 1024,
               "Largest message an agent may send (64 KiB..64 MiB).",
               (_int_range(64 * 1024, 64 * 1024 * 1024),)),
        Option("max_hosts", INT, 2048,
               "Hosts this process serves. At start it raises its soft open-file limit to the "
               "hard one and refuses to start (exit 1, `fd_limit_too_low`) when that is below "
               "`max_hosts` + the web page's and metrics endpoint's connection caps + 256; set "
               "`LimitNOFILE=` in the unit accordingly.",
               (_int_range(1, 1_000_000),)),
        Option("log_format", STR, "kv",
               "Log line format: `kv` (logfmt) or `json`, as linkpassd's.",
               (_one_of("kv", "json"),)),
        Option("log_level", STR, "info", "Lowest level that is logged.",
               (_one_of("debug", "info", "warning", "error"),)),
    ),
    rules=(
        "`store = \"postgresql\"` needs `postgresql_dsn`; `store = \"sqlite\"` refuses it",
        "with `store = \"sqlite\"`, the directory of `database` exists (checked when the file "
        "is loaded, not for text checked in memory)",
        "`listen`, `[web] listen` and `[metrics] listen` are three different addresses "
        "(port 0 excepted)",
    ),
)

TLS = Section(
    "tls",
    array=False,
    help="Mutual TLS: agents and operators must present a certificate signed by `ca`. The "
         "files are read at `--check-config` and once at start (a renewed server certificate "
         "needs a restart). Certificates: `scripts/linkpass-certs` (docs/aggregator.md).",
    options=(
        Option("ca", STR, "", "PEM file of the CA that clients' certificates must be signed by.",
               _FILE, default_doc="none: required unless `insecure`"),
        Option("cert", STR, "", "PEM file of the aggregator's own certificate.",
               _FILE, default_doc="none: required unless `insecure`"),
        Option("key", STR, "", "PEM file of the private key of `cert`.",
               _FILE, default_doc="none: required unless `insecure`"),
        Option("insecure", BOOL, False,
               "Plaintext, no certificates and no client authentication: any client may report "
               "as any host and drain any port. For labs only (it says so loudly at start)."),
    ),
    rules=(
        "`ca`, `cert` and `key` are all set unless `insecure = true`; they are readable, the "
        "CA parses and `cert` matches `key` (checked when the file is loaded)",
        "`insecure = true` together with any of `ca`, `cert`, `key` is refused",
    ),
)

MESH = Section(
    "mesh",
    array=False,
    help="The probe mesh: which peers under other leaves each host's echo probes go to.",
    options=(
        Option("peers_per_rail", INT, 3, "Echo peers each host probes per rail.",
               (_int_range(1, 64),)),
        Option("max_peers_per_rail", INT, 8, "Hard bound on a host's echo peers per rail.",
               (_int_range(1, 256),)),
    ),
    rules=("`max_peers_per_rail` ≥ `peers_per_rail`",),
)

FENCE = Section(
    "fence",
    array=False,
    help="Fence grants (docs/fencing.md): how many ports behind one leaf may be fenced at once "
         "across the hosts this aggregator serves, so that a leaf failure does not fence every "
         "host's port on it. Hosts with `[fence] require_leaf_grant = true` fence only what is "
         "granted.",
    options=(
        Option("leaf_cap", INT, 1,
               "Ports fenced (down or under test) at once per leaf; 0 grants none.",
               (_int_range(0, 4096),)),
    ),
)

VALIDATION = Section(
    "validation",
    array=False,
    help="Fleet validation (`linkpassctl validate`, docs/validate.md).",
    options=(
        Option("host_budget_pps", FLOAT, 10_000.0,
               "Probes each host may send and answer per second, shared over its pairs "
               "(linkpassd/validate/schedule.py). Lower it where hosts share CPUs (a lab: all "
               "its hosts on one machine).",
               (_between(100, 10_000_000),)),
    ),
)

WEB = Section(
    "web",
    array=False,
    help="The read-only fleet page. No TLS and no login: keep it on loopback or behind a proxy.",
    options=(
        Option("listen", STR, "127.0.0.1:9480",
               "Address of the page, `HOST:PORT` (no Unix socket); `\"\"` turns it off.",
               (_TEXT, _server_listen(optional=True))),
    ),
)

METRICS = Section(
    "metrics",
    array=False,
    help="Prometheus metrics over HTTP (`/metrics`, docs/metrics.md).",
    options=(
        Option("listen", STR, "", "Address of the endpoint, `HOST:PORT`; `\"\"`: no metrics.",
               (_TEXT, _server_listen(optional=True))),
    ),
)

AGGREGATOR_SCHEMA: tuple[Section, ...] = (SERVER, TLS, MESH, FENCE, VALIDATION, WEB, METRICS)


def default(section: str, key: str) -> Any:
    """An option's default, for the dataclass fields built from this table."""
    found = next(s for s in AGGREGATOR_SCHEMA if s.name == section).option(key)
    if found is None:
        raise KeyError(f"{section}.{key}")
    return found.default
