"""The aggregator's TOML config (`/etc/linkpass/aggregator.toml`) -> a frozen `Settings`.

Every option is declared once, in the option table config.aggregator_schema
(type, default, help, checks), on the same machinery as linkpassd's config,
which also renders its reference (docs/aggregator-config.md). Same rules as
linkpassd's: every key is known (an unknown one is refused, named), every
value is checked, and the error names the file, the key and the value, on one
line (`linkpass-aggregator --check-config` prints it and exits 1; the server
refuses to start with it and exits 2, which the unit's
RestartPreventExitStatus= keeps from restarting in a loop).

The TLS files are read and checked too (the certificate matches its key, the
CA parses): a typo in a path shows at `--check-config`, not as every agent's
handshake failing later.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from linkpassd.config.aggregator_schema import AGGREGATOR_DEFAULT_PATH as DEFAULT_PATH
from linkpassd.config.aggregator_schema import AGGREGATOR_SCHEMA, default
from linkpassd.config.build import parse_toml, read_config_text, validate_sections
from linkpassd.config.checks import UNIX_PREFIX, ConfigError, split_listen

__all__ = ["DEFAULT_PATH", "Settings", "TlsSettings", "check_tls_files", "load_settings",
           "parse_settings"]


@dataclass(frozen=True)
class TlsSettings:
    ca: str = default("tls", "ca")
    cert: str = default("tls", "cert")
    key: str = default("tls", "key")
    insecure: bool = default("tls", "insecure")


@dataclass(frozen=True)
class Settings:
    """The validated config; each field's default is its option's (AGGREGATOR_SCHEMA)."""

    source: str = "(defaults)"
    listen: str = default("aggregator", "listen")
    database: str = default("aggregator", "database")  # the SQLite file (store = "sqlite")
    store: str = default("aggregator", "store")  # or "postgresql": replicas sharing one database
    postgresql_dsn: str = default("aggregator", "postgresql_dsn")
    retention_days: int = default("aggregator", "retention_days")
    restart_cost_min: float = default("aggregator", "restart_cost_min")
    heartbeat_s: float = default("aggregator", "heartbeat_s")
    max_message_bytes: int = default("aggregator", "max_message_bytes")
    max_hosts: int = default("aggregator", "max_hosts")  # what the open-file limit must allow
    log_format: str = default("aggregator", "log_format")
    log_level: str = default("aggregator", "log_level")
    tls: TlsSettings = field(default_factory=TlsSettings)
    peers_per_rail: int = default("mesh", "peers_per_rail")
    max_peers_per_rail: int = default("mesh", "max_peers_per_rail")
    web_listen: str = default("web", "listen")  # "" = no web page
    metrics_listen: str = default("metrics", "listen")  # "" = no metrics endpoint
    # fleet validation: probes sent + answered per host per second (validate.schedule)
    validation_host_budget_pps: float = default("validation", "host_budget_pps")
    fence_leaf_cap: int = default("fence", "leaf_cap")  # ports fenced at once per leaf


def parse_settings(text: str, source: str) -> Settings:
    """TOML text -> Settings (no file checks); ConfigError naming the problem."""
    return settings_from_document(parse_toml(text, source), source)


def settings_from_document(doc: dict[str, Any], source: str) -> Settings:
    """A parsed TOML document -> Settings: the option table's checks, then
    those across options."""
    values = validate_sections(doc, AGGREGATOR_SCHEMA, source)
    settings = Settings(
        source=source, tls=TlsSettings(**values["tls"]), **values["aggregator"],
        peers_per_rail=values["mesh"]["peers_per_rail"],
        max_peers_per_rail=values["mesh"]["max_peers_per_rail"],
        web_listen=values["web"]["listen"], metrics_listen=values["metrics"]["listen"],
        validation_host_budget_pps=values["validation"]["host_budget_pps"],
        fence_leaf_cap=values["fence"]["leaf_cap"])
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
                          f"{s.max_peers_per_rail} must be at least mesh.peers_per_rail "
                          f"({s.peers_per_rail})")
    files = {"ca": s.tls.ca, "cert": s.tls.cert, "key": s.tls.key}
    if s.tls.insecure:
        given = [f"tls.{k}" for k, v in files.items() if v]
        if given:
            raise ConfigError(src, "tls.insecure", f"true together with {', '.join(given)}: "
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
            raise ConfigError(src, key, f"{text!r} is the same address as {seen[address]}")
        seen[address] = key


def check_tls_files(s: Settings) -> None:
    """Read the TLS files as the server will: ConfigError naming the file and why."""
    if s.tls.insecure:
        return
    for key, path in (("tls.ca", s.tls.ca), ("tls.cert", s.tls.cert), ("tls.key", s.tls.key)):
        if not os.access(path, os.R_OK):
            why = "does not exist" if not os.path.exists(path) else "is not readable by this user"
            raise ConfigError(s.source, key, f"{path!r} {why}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_verify_locations(cafile=s.tls.ca)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(s.source, "tls.ca", f"{s.tls.ca!r} is not a PEM CA certificate ({exc})") from None
    try:
        context.load_cert_chain(certfile=s.tls.cert, keyfile=s.tls.key)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(s.source, "tls.cert", f"{s.tls.cert!r} with tls.key = {s.tls.key!r}: "
                          f"not a PEM certificate and its matching key ({exc})") from None


def load_settings(path: str | os.PathLike[str]) -> Settings:
    """Read, parse and check `path`, TLS files included."""
    source = os.fsdecode(path)
    settings = parse_settings(read_config_text(path, "a linkpass-aggregator config"), source)
    check_tls_files(settings)
    if settings.store == "sqlite" and not Path(settings.database).parent.is_dir():
        raise ConfigError(source, "aggregator.database", f"{settings.database!r}: its directory "
                          "does not exist")
    return settings
