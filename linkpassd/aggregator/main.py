"""Entry point of `linkpass-aggregator`: the fleet's gRPC server (server.py),
its store (SQLite, or PostgreSQL shared by replicas), the web page (web.py) and the metrics endpoint.

    linkpass-aggregator --config /etc/linkpass/aggregator.toml
    linkpass-aggregator --check-config /etc/linkpass/aggregator.toml   (or --config FILE --check-config)

Exit status: 0 after SIGTERM/SIGINT (a graceful stop: health NOT_SERVING,
streams ended, calls answered for up to 5 s, store closed); 1 when
`--check-config` finds a problem, or the server cannot start (port taken,
store unusable); 2 when the config is bad at start, which the unit's
RestartPreventExitStatus= keeps systemd from retrying. Under systemd
(NOTIFY_SOCKET) it reports READY=1 once serving and pings the watchdog from
its event loop, so a wedged loop gets the process restarted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time

import structlog

import linkpassd
from linkpassd import logs
from linkpassd.adapters import fdlimit, sdnotify
from linkpassd.aggregator.metrics import AggregatorMetrics
from linkpassd.aggregator.server import AggregatorServer
from linkpassd.aggregator.settings import DEFAULT_PATH, Settings, load_settings
from linkpassd.aggregator.store import EventQuery, Store, StoreError
from linkpassd.aggregator.watch import newest_event_id
from linkpassd.config.checks import ConfigError, redacted_dsn
from linkpassd.config.cli import add_config_options, config_choice

log = structlog.get_logger("linkpassd.aggregator")

PRUNE_INTERVAL_S = 3600.0
STOP_GRACE_S = 5.0
PAGE_EVENTS = 50
PAGE_SUMMARY_DAYS = 7
# Descriptors beyond one per host: the store, logs, the worker's pipes,
# grpc's own, operators' and linkpassctl's connections.
FD_RESERVE = 256


def fds_needed(settings: Settings) -> int:
    """Open files the configuration needs: a connection per host, the web
    page's and the metrics endpoint's connection caps, and a reserve."""
    from linkpassd.adapters import metrics_http
    from linkpassd.aggregator import web
    return (settings.max_hosts + (web.MAX_CONNECTIONS if settings.web_listen else 0)
            + (metrics_http.MAX_CONNECTIONS if settings.metrics_listen else 0) + FD_RESERVE)


def check_config(path: str) -> int:
    """`--check-config`: 0 and an OK line, or 1 and the one-line error."""
    try:
        s = load_settings(path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    mode = "INSECURE (no TLS)" if s.tls.insecure else "mTLS"
    print(f"OK: {s.source}: listen {s.listen} ({mode}), {store_label(s)}, "
          f"web {s.web_listen or 'off'}, metrics {s.metrics_listen or 'off'}")
    return 0


def store_label(settings: Settings) -> str:
    """Which store, for the OK line and logs (a DSN without its password)."""
    if settings.store == "postgresql":
        return f"store postgresql {redacted_dsn(settings.postgresql_dsn)}"
    return f"database {settings.database}"


def build_store(settings: Settings) -> Store:
    """The store `settings.store` names (not opened yet)."""
    if settings.store == "postgresql":
        from linkpassd.aggregator.pg_store import PgStore  # asyncpg only when used

        return PgStore(settings.postgresql_dsn)
    from linkpassd.aggregator.sqlite_store import SqliteStore

    return SqliteStore(settings.database)


def _watchdog_interval_s() -> float | None:
    """Half of WatchdogSec (systemd passes WATCHDOG_USEC), or None without one."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2e6


async def _every(interval_s: float, action, what: str) -> None:
    while True:
        try:
            await action()
        except Exception as exc:  # noqa: BLE001 - one failed round must not end the loop
            log.error(f"{what}_failed", error=str(exc))
        await asyncio.sleep(interval_s)


async def serve(settings: Settings, *, stop: asyncio.Event | None = None) -> int:
    """Run until `stop` is set (or SIGTERM/SIGINT); the exit status."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread (tests)
            loop.add_signal_handler(sig, stop.set)
    if settings.tls.insecure:
        log.warning("INSECURE_MODE", listen=settings.listen,
                    warning="tls.insecure = true: NO TLS, NO CLIENT AUTHENTICATION; any client may report "
                            "as any host and drain any port. For labs only.")
    limit = fdlimit.raise_nofile(fds_needed(settings))
    if not limit.enough:
        # Refused, not warned: below it real agents are locked out by the
        # first flood of idle connections, with nothing else logged.
        log.error("fd_limit_too_low", limit=limit.soft, hard=limit.hard, needed=limit.needed,
                  max_hosts=settings.max_hosts, detail=limit.describe())
        return 1
    log.info("fd_limit", limit=limit.soft, hard=limit.hard, needed=limit.needed, raised_from=limit.before)
    store = build_store(settings)
    try:
        await store.open()
    except StoreError as exc:
        log.error("store_unusable", store=store_label(settings), error=str(exc))
        return 1
    metrics = AggregatorMetrics()
    server = AggregatorServer(settings, store, metrics=metrics)
    tasks: list[asyncio.Task[None]] = []
    web_server = metrics_http = None
    try:
        try:
            port = await server.start()
            if settings.metrics_listen:
                metrics_http = metrics.serve(settings.metrics_listen)
            if settings.web_listen:
                web_server = await _start_web(settings, server, store)
        except OSError as exc:
            log.error("cannot_listen", error=str(exc))
            return 1
        retention_s = settings.retention_days * 86400.0

        async def prune() -> None:
            deleted = await store.prune(time.time() - retention_s)
            if deleted:
                log.info("retention_pruned", events=deleted, retention_days=settings.retention_days)

        tasks.append(asyncio.create_task(_every(PRUNE_INTERVAL_S, prune, "retention_prune")))
        interval = _watchdog_interval_s()
        if interval is not None:
            async def ping() -> None:
                sdnotify.notify("WATCHDOG=1")
            tasks.append(asyncio.create_task(_every(interval, ping, "watchdog")))
        log.info("serving", listen=settings.listen, port=port, store=store_label(settings),
                 tls="insecure" if settings.tls.insecure else "mtls",
                 web="off" if web_server is None else "%s:%d" % web_server.address,
                 metrics=settings.metrics_listen or "off", version=linkpassd.__version__)
        sdnotify.notify(f"READY=1\nSTATUS=serving on {settings.listen}")
        await stop.wait()
        log.info("stopping")
        sdnotify.notify("STOPPING=1")
        return 0
    finally:
        for task in tasks:
            task.cancel()
        if web_server is not None:
            await web_server.close()
        await server.stop(STOP_GRACE_S)
        if metrics_http is not None:
            metrics_http[0].shutdown()
            metrics_http[0].server_close()
        await store.close()


async def _start_web(settings: Settings, server: AggregatorServer, store):
    """The read-only page (web.py), fed from the same queries as FleetService."""
    from linkpassd.aggregator import web

    api = server.fleet_api
    newest = 0

    async def page() -> str:
        nonlocal newest
        newest = await newest_event_id(store, newest)
        events = await api.events_list(EventQuery(after_id=max(0, newest - PAGE_EVENTS), limit=PAGE_EVENTS))
        hosts, summary = await api.hosts_response(), await api.summary(PAGE_SUMMARY_DAYS)
        # In a thread: a page of a big fleet is tens of milliseconds of
        # string work that would otherwise hold every agent's acks.
        return await asyncio.to_thread(web.render_page, hosts, events, summary,
                                       insecure=settings.tls.insecure, now=time.time(),
                                       validation=api.validations.last,
                                       refused=tuple(server.fleet.refused.values()))

    async def health() -> tuple[bool, str]:
        return True, f"ok: {len(server.fleet.sessions)} hosts connected"

    return await web.serve(settings.web_listen, page, health)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="linkpass-aggregator",
                                     description="linkpass fleet aggregator (gRPC, mTLS)")
    add_config_options(parser, default_path=DEFAULT_PATH, checks=" and read its TLS files")
    parser.add_argument("--version", action="version", version=linkpassd.__version__)
    choice = config_choice(parser, parser.parse_args(argv), default_path=DEFAULT_PATH)
    if choice.check_only:
        return check_config(choice.path)
    try:
        settings = load_settings(choice.path)
    except ConfigError as exc:
        print(f"linkpass-aggregator: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log_format, settings.log_level)
    try:
        return asyncio.run(serve(settings))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
