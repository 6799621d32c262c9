"""The aggregator's TOML config (`/etc/linkpass/aggregator.toml`) -> a frozen `Settings`.

Same rules as linkpassd's config: every key is known (an unknown one is
refused, named), every value is checked, and the error names the file, the
key and the value, on one line (`linkpass-aggregator --check-config` prints it
and exits 1; the server refuses to start with it and exits 2, which the unit's
RestartPreventExitStatus= keeps from restarting in a loop).

The TLS files are read and checked too (the certificate matches its key, the
CA parses): a typo in a path shows at `--check-config`, not as every agent's
handshake failing later.
"""

from __future__ import annotations

import ipaddress
import math
import os
import ssl
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from linkpassd.config.checks import ConfigError

DEFAULT_PATH = "/etc/linkpass/aggregator.toml"
MAX_FILE_BYTES = 1 << 20
LOG_FORMATS = ("kv", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
STORES = ("sqlite", "postgresql")
DSN_SCHEMES = ("postgresql", "postgres")


@dataclass(frozen=True)
class TlsSettings:
    ca: str = ""
    cert: str = ""
    key: str = ""
    insecure: bool = False


@dataclass(frozen=True)
class Settings:
    source: str = "(defaults)"
    listen: str = "0.0.0.0:7443"
    database: str = "/var/lib/linkpass-aggregator/fleet.db"  # the SQLite file (store = "sqlite")
    store: str = "sqlite"  # or "postgresql": replicas sharing one database (issue 14)
    postgresql_dsn: str = ""  # postgresql://... (store = "postgresql")
    retention_days: int = 30
    restart_cost_min: float = 30.0
    heartbeat_s: float = 5.0
    max_message_bytes: int = 4 * 1024 * 1024
    max_hosts: int = 2048  # hosts one process serves: what its open-file limit must allow (fdlimit)
    log_format: str = "kv"
    log_level: str = "info"
    tls: TlsSettings = field(default_factory=TlsSettings)
    peers_per_rail: int = 3
    max_peers_per_rail: int = 8
    web_listen: str = "127.0.0.1:9480"  # "" = no web page
    metrics_listen: str = ""  # "" = no metrics endpoint
    # fleet validation: probes sent + answered per host per second (validate.schedule)
    validation_host_budget_pps: float = 10_000.0


# section -> key -> (Settings field, checker). A checker takes the value and
# returns it converted, or raises ValueError saying what is expected.
def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a string")
    if any(not c.isprintable() for c in value):
        raise ValueError("must not hold control characters")
    return value


def _path(value: Any) -> str:
    text = _text(value)
    if not text:
        raise ValueError("expected a file path, not empty")
    return text


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("expected true or false")
    return value


def _int_range(low: int, high: int):
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer from {low} to {high}")
        if not low <= value <= high:
            raise ValueError(f"expected an integer from {low} to {high}")
        return value
    return check


def _number_range(low: float, high: float):
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number from {low:g} to {high:g}")
        if not math.isfinite(value) or not low <= value <= high:
            raise ValueError(f"expected a number from {low:g} to {high:g}")
        return float(value)
    return check


def _choice(options: tuple[str, ...]):
    def check(value: Any) -> str:
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return value
    return check


def split_listen(text: str) -> tuple[str, int]:
    """"HOST:PORT" or "[V6]:PORT" -> (host, port); ValueError saying why not.
    Port 0 means any free port (tests)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError("expected HOST:PORT, e.g. 0.0.0.0:7443 or [::]:7443")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{host} is not an IPv6 address") from None
        host = host[1:-1]
    elif ":" in host:
        raise ValueError("an IPv6 address needs brackets: [::]:7443")
    elif not all(part and (part.isalnum() or set(part) <= set("abcdefghijklmnopqrstuvwxyz"
                                                             "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-"))
                 for part in host.split(".")):
        raise ValueError(f"{host!r} is not an address or host name")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"port {port!r} is not a number from 0 to 65535")
    return host, int(port)


UNIX_PREFIX = "unix:"


def check_unix_listen(text: str) -> str:
    """"unix:/absolute/path": a Unix socket (labs: daemons in network
    namespaces reach it through the file system). ValueError saying why not."""
    path = text[len(UNIX_PREFIX):]
    if not path.startswith("/"):
        raise ValueError(f"a Unix socket needs an absolute path: unix:/run/..., not {text!r}")
    if len(path.encode()) > 107:
        raise ValueError(f"{path!r} is longer than a Unix socket name may be (107 bytes)")
    return text


def redacted_dsn(text: str) -> str:
    """A DSN without its password, for messages (a config error must not print it)."""
    try:
        parts = urlsplit(text)
        if parts.password is None:
            return text
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
    except ValueError:
        return "(a DSN that is not a URL)"


def _dsn(value: Any) -> str:
    """A postgresql:// URL (the host may be a Unix socket directory:
    postgresql://user@/db?host=/run/postgresql)."""
    text = _text(value)
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        raise ValueError(f"not a postgresql:// URL ({exc})") from None
    if parts.scheme not in DSN_SCHEMES or not text.startswith(f"{parts.scheme}://"):
        raise ValueError("expected a postgresql:// URL, e.g. postgresql://linkpass@db.example/linkpass")
    if any(c.isspace() for c in text):
        raise ValueError("a URL has no spaces (percent-encode them)")
    return text


def _listen(optional: bool, unix: bool = False):
    def check(value: Any) -> str:
        text = _text(value)
        if optional and text == "":
            return text
        if unix and text.startswith(UNIX_PREFIX):
            return check_unix_listen(text)
        split_listen(text)
        return text
    return check


SECRET_KEYS = {"aggregator.postgresql_dsn"}  # shown without a password in errors

SCHEMA: dict[str, dict[str, tuple[str, Any]]] = {
    "aggregator": {
        "listen": ("listen", _listen(optional=False, unix=True)),
        "database": ("database", _path),
        "store": ("store", _choice(STORES)),
        "postgresql_dsn": ("postgresql_dsn", _dsn),
        "retention_days": ("retention_days", _int_range(1, 3650)),
        "restart_cost_min": ("restart_cost_min", _number_range(0, 7 * 24 * 60)),
        "heartbeat_s": ("heartbeat_s", _number_range(0.5, 300)),
        "max_message_bytes": ("max_message_bytes", _int_range(64 * 1024, 64 * 1024 * 1024)),
        "max_hosts": ("max_hosts", _int_range(1, 1_000_000)),
        "log_format": ("log_format", _choice(LOG_FORMATS)),
        "log_level": ("log_level", _choice(LOG_LEVELS)),
    },
    "tls": {
        "ca": ("ca", _path),
        "cert": ("cert", _path),
        "key": ("key", _path),
        "insecure": ("insecure", _bool),
    },
    "mesh": {
        "peers_per_rail": ("peers_per_rail", _int_range(1, 64)),
        "max_peers_per_rail": ("max_peers_per_rail", _int_range(1, 256)),
    },
    "validation": {"host_budget_pps": ("validation_host_budget_pps", _number_range(100, 10_000_000))},
    "web": {"listen": ("web_listen", _listen(optional=True))},
    "metrics": {"listen": ("metrics_listen", _listen(optional=True))},
}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def parse_settings(text: str, source: str) -> Settings:
    """TOML text -> Settings (no file checks); ConfigError naming the problem."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, None, f"not valid TOML: {exc}") from None
    values: dict[str, Any] = {}
    tls: dict[str, Any] = {}
    for section, body in doc.items():
        if section not in SCHEMA:
            raise ConfigError(source, section, f"unknown section; expected one of {', '.join(SCHEMA)}")
        if not isinstance(body, dict):
            raise ConfigError(source, section, f"= {_shown(body)}: expected a [{section}] table")
        for key, value in body.items():
            name = f"{section}.{key}"
            if key not in SCHEMA[section]:
                raise ConfigError(source, name, f"unknown key; [{section}] takes "
                                  f"{', '.join(SCHEMA[section])}")
            target, check = SCHEMA[section][key]
            try:
                converted = check(value)
            except ValueError as exc:
                shown = _shown(redacted_dsn(value)) if name in SECRET_KEYS and isinstance(value, str) else _shown(value)
                raise ConfigError(source, name, f"= {shown}: {exc}") from None
            (tls if section == "tls" else values)[target] = converted
    settings = Settings(source=source, tls=TlsSettings(**tls), **values)
    _check_together(settings)
    return settings


def _check_together(s: Settings) -> None:
    src = s.source
    if s.store == "postgresql" and not s.postgresql_dsn:
        raise ConfigError(src, "aggregator.postgresql_dsn", 'missing: store = "postgresql" needs '
                          "postgresql_dsn, a postgresql:// URL of the database the replicas share")
    if s.store == "sqlite" and s.postgresql_dsn:
        raise ConfigError(src, "aggregator.postgresql_dsn", 'given, but store is "sqlite": set '
                          'store = "postgresql" to use it (or remove it)')
    if s.max_peers_per_rail < s.peers_per_rail:
        raise ConfigError(src, "mesh.max_peers_per_rail",
                          f"= {s.max_peers_per_rail}: must be at least mesh.peers_per_rail ({s.peers_per_rail})")
    files = {"ca": s.tls.ca, "cert": s.tls.cert, "key": s.tls.key}
    if s.tls.insecure:
        given = [f"tls.{k}" for k, v in files.items() if v]
        if given:
            raise ConfigError(src, "tls.insecure", f"= true together with {', '.join(given)}: "
                              "insecure mode uses no certificates; remove one or the other")
    else:
        for key, value in files.items():
            if not value:
                raise ConfigError(src, f"tls.{key}", "missing: mTLS needs tls.ca, tls.cert and tls.key "
                                  "(or tls.insecure = true, for labs only)")
    listens = {"aggregator.listen": s.listen, "web.listen": s.web_listen, "metrics.listen": s.metrics_listen}
    seen: dict[tuple[str, int], str] = {}
    for key, text in listens.items():
        if not text or text.startswith(UNIX_PREFIX):
            continue
        address = split_listen(text)
        if address[1] != 0 and address in seen:
            raise ConfigError(src, key, f"= {text!r}: the same address as {seen[address]}")
        seen[address] = key


def check_tls_files(s: Settings) -> None:
    """Read the TLS files as the server will: ConfigError naming the file and why."""
    if s.tls.insecure:
        return
    for key, path in (("tls.ca", s.tls.ca), ("tls.cert", s.tls.cert), ("tls.key", s.tls.key)):
        if not os.access(path, os.R_OK):
            why = "does not exist" if not os.path.exists(path) else "is not readable by this user"
            raise ConfigError(s.source, key, f"= {path!r}: {why}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_verify_locations(cafile=s.tls.ca)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(s.source, "tls.ca", f"= {s.tls.ca!r}: not a PEM CA certificate ({exc})") from None
    try:
        context.load_cert_chain(certfile=s.tls.cert, keyfile=s.tls.key)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(s.source, "tls.cert", f"= {s.tls.cert!r} with tls.key = {s.tls.key!r}: "
                          f"not a PEM certificate and its matching key ({exc})") from None


def load_settings(path: str | os.PathLike[str]) -> Settings:
    """Read, parse and check `path`, TLS files included."""
    source = str(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(source, None, f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(source, None, f"larger than {MAX_FILE_BYTES} bytes; not a config file?")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(source, None, f"not UTF-8 (byte {exc.start})") from None
    settings = parse_settings(text, source)
    check_tls_files(settings)
    if settings.store == "sqlite" and not Path(settings.database).parent.is_dir():
        raise ConfigError(source, "aggregator.database", f"= {settings.database!r}: its directory "
                          "does not exist")
    return settings
