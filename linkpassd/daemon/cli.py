"""linkpassd's command line: parse the arguments, load the config, take the
instance lock, and run the daemon (daemon.loop.Daemon) until a signal stops
it. `python -m linkpassd.daemon` and the `linkpassd` console script both
land in `main`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import structlog

import linkpassd
from linkpassd import config as configmod
from linkpassd import logs
from linkpassd.adapters.control_server import ControlSocketError
from linkpassd.adapters.instancelock import AlreadyRunning, InstanceLock
from linkpassd.config.cli import add_config_options, config_choice
from linkpassd.config.reference import control_socket_problem
from linkpassd.core.model import Config
from linkpassd.daemon.loop import Daemon
from linkpassd.daemon.statefiles import StateFiles

log = structlog.get_logger("linkpassd")

DEFAULT_CONFIG = "/etc/linkpass/linkpassd.toml"


DESCRIPTION = """\
linkpassd keeps this host's GPU-cluster traffic on healthy links. It watches
every rail's NIC, optic and cable (carrier, error counters, module readings,
BFD and echo probes), moves a rail's routing table and multipath groups off a
port that fails or degrades (within the detection time the config sets, and
never below it), moves them back after the port has proved itself again, and
reports each decision to linkpass-aggregator. Stopping it leaves the routes as
they are (fail-static)."""

EPILOG = """\
Query it and drain ports with linkpassctl (status, links, explain PORT,
drain PORT --reason TEXT, events). Signals: SIGHUP re-reads the config (a bad
one is refused and the running one kept); SIGTERM stops. One linkpassd per
run directory (run_dir/linkpassd.lock). The config is documented in
docs/config.md.

Exit status: 0 stopped by a signal; 1 --check-config found a problem, or
another linkpassd is running; 2 the config is bad at start; 3 --check-config:
the file is valid but the aggregator would refuse this host (host_id and
certificate differ), which does not stop linkpassd from protecting it."""


FD_RESERVE = 256  # state files, netlink and ethtool sockets, logs, the responder, grpc's own
FDS_PER_RAIL = 16  # a rail's probe sockets (echo, BFD sessions) with room


def fds_needed(config: Config) -> int:
    """Open files the configuration needs: the control socket's and the
    metrics endpoint's connection caps, probe sockets per rail, a reserve."""
    from linkpassd.adapters import metrics_http
    from linkpassd.adapters.control_access import MAX_CONNECTIONS
    return (MAX_CONNECTIONS + (metrics_http.MAX_CONNECTIONS if config.metrics_listen else 0)
            + FDS_PER_RAIL * len(config.rails) + FD_RESERVE)


def check_fd_limit(files: StateFiles, config: Config) -> None:
    """Raise the soft open-file limit to the hard one; below what the config
    needs, warn and show it in `status` as a problem (the host is still
    protected: linkpassd never refuses to start over it)."""
    from linkpassd.adapters import fdlimit
    limit = fdlimit.raise_nofile(fds_needed(config))
    if limit.enough:
        log.info("fd_limit", limit=limit.soft, hard=limit.hard, needed=limit.needed, raised_from=limit.before)
        return
    log.warning("fd_limit_too_low", limit=limit.soft, hard=limit.hard, needed=limit.needed,
                detail=limit.describe())
    files.problem("open-file limit", limit.describe(), kind="fd_limit")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="linkpassd", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_options(parser, default_path=DEFAULT_CONFIG,
                       checks=" and that the aggregator would accept this host's certificate")
    parser.add_argument("--version", action="version", version=linkpassd.__version__)
    choice = config_choice(parser, parser.parse_args(argv), default_path=DEFAULT_CONFIG)
    if choice.check_only:
        return configmod.check_config_main(choice.path)
    config_path = choice.path
    try:
        config = configmod.load_config(config_path)
        socket_problem = control_socket_problem(config.control_socket)
        if socket_problem:  # exit 2: the unit does not restart it in a loop
            raise configmod.ConfigError(config.source, "daemon.control_socket", socket_problem)
    except configmod.ConfigError as exc:
        print(f"linkpassd: {exc}", file=sys.stderr)
        return 2
    # Before anything is touched: a second daemon on this run directory
    # would fight the first over every route, socket and state file.
    lock = InstanceLock(config.run_dir)
    try:
        lock.acquire()
    except AlreadyRunning as exc:
        print(f"linkpassd: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"linkpassd: cannot take the lock {lock.path}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    logs.configure(config.log_format, config.log_level)
    daemon = Daemon(config, config_path)
    check_fd_limit(daemon.files, config)
    try:
        asyncio.run(daemon.run())
    except KeyboardInterrupt:
        pass
    except ControlSocketError as exc:  # one line, not a traceback
        log.error("control_socket_failed", error=str(exc))
        print(f"linkpassd: {exc}", file=sys.stderr)
        return 1
    return 0
