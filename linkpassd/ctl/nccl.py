"""`linkpassctl nccl-env`: the NCCL device lists a launcher starts a job with.

Reads health.json, not the control socket, so a launcher running as any user
(or in a container with /run/linkpass mounted) needs no group membership.
It refuses rather than guesses: a missing, unreadable or stale file exits
STALE (the launcher falls back to its static NIC list, linkpass being
absent), and a host with no usable port exits NO_USABLE with nothing on
stdout (every NIC is bad: do not start here).  `--port-failover VERSION`
adds NCCL 2.29.7+'s port failover settings over the same usable ports (the
job's NCCL version is given because only the launcher knows it).  See
docs/launchers.md.
"""

from __future__ import annotations

import json
import os
import shlex
import time

import click

from linkpassd.adapters.healthfile import HealthFile, HealthFileError, own_pid_namespace
from linkpassd.core import healthdoc
from linkpassd.ctl import terminal
from linkpassd.exitcodes import ExitCode
from linkpassd.timefmt import local_iso

DEFAULT_HEALTH_FILE = "/run/linkpass/health.json"


class NcclEnvError(click.ClickException):
    """One line on stderr and the exit code a launcher branches on."""

    def __init__(self, message: str, exit_code: ExitCode) -> None:
        super().__init__(message)
        self.exit_code = int(exit_code)

    def show(self, file=None) -> None:
        terminal.echo(f"linkpassctl: nccl-env: {self.format_message()}", err=True)


def pid_alive(pid: int) -> bool | None:
    """Whether process `pid` exists here; None when this process cannot tell."""
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else (root)
    except OSError:
        return None
    return True


def _failover_version(ctx: click.Context, param: click.Parameter,
                      value: str | None) -> tuple[int, int, int] | None:
    """--port-failover's NCCL version, checked before anything is read: a
    malformed version or one without port failover is a usage error naming it."""
    if value is None:
        return None
    try:
        version = healthdoc.parse_nccl_version(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    refusal = healthdoc.port_failover_refusal(version)
    if refusal is not None:
        raise click.BadParameter(refusal, ctx=ctx, param=param)
    return version


def render(env: dict[str, str], doc: healthdoc.HealthDoc, fmt: str) -> str:
    """The variables as `NAME=value` lines, `export NAME=value` lines (shell-quoted),
    or one JSON object with the document they came from."""
    if fmt == "json":
        return json.dumps({"env": env, "hostname": doc.hostname, "boot_id": doc.boot_id,
                           "generation": doc.generation, "written_at": doc.written_at},
                          sort_keys=True)
    if fmt == "export":
        return "\n".join(f"export {name}={shlex.quote(value)}" for name, value in env.items())
    return "\n".join(f"{name}={value}" for name, value in env.items())


@click.command("nccl-env")
@click.option("--file", "path", metavar="PATH", default=DEFAULT_HEALTH_FILE, show_default=True,
              envvar="LINKPASS_HEALTH_FILE", show_envvar=True, help="linkpassd's health document.")
@click.option("--format", "fmt", type=click.Choice(["env", "export", "json"]), default="env",
              show_default=True,
              help="env: NAME=value lines; export: for eval in a shell; json: for programs.")
@click.option("--no-pid-check", is_flag=True,
              help="Do not check that the daemon's pid is alive; the file's valid_until still "
                   "applies.  (Skipped by itself when this process is in another PID namespace "
                   "than the daemon, or the file does not say which.)")
@click.option("--port-failover", "failover_version", metavar="NCCL_VERSION",
              callback=_failover_version,
              help="Also print what NCCL's port failover needs (NCCL_IB_RESILIENCY_PORT_FAILOVER=1 "
                   "and NCCL_NET_FORCE_MERGE over the usable ports), for the NCCL version the job "
                   "runs (2.29.7 or later; an older one is refused). NCCL moves a queue pair only "
                   "on its completion error (for a port that silently stops delivering: after the IB retry timer) "
                   "and only to another port of its merged NIC, one failed port per merged NIC.")
@click.option("--merge-size", type=click.IntRange(2, healthdoc.MERGE_MAX),
              default=healthdoc.DEFAULT_MERGE_SIZE, show_default=True,
              help="With --port-failover: ports per merged NIC, cut in rail order. A port fails "
                   "over only to another port of its group.")
def nccl_env(path: str, fmt: str, no_pid_check: bool,
             failover_version: tuple[int, int, int] | None, merge_size: int) -> None:
    """NCCL_IB_HCA and NCCL_SOCKET_IFNAME naming only this host's usable ports.

    Exact-match syntax (a leading '='), in rail order, e.g.
    NCCL_IB_HCA==mlx5_0:1,mlx5_3:1 and NCCL_SOCKET_IFNAME==eth0,eth3.
    Use before starting a job: eval "$(linkpassctl nccl-env --format export)".
    With --port-failover 2.29.7 (the job's NCCL version), also
    NCCL_IB_RESILIENCY_PORT_FAILOVER=1 and NCCL_NET_FORCE_MERGE merging the
    usable RDMA ports in groups of --merge-size; notes go to stderr. NCCL
    then survives one failed port per merged NIC; see docs/launchers.md.
    Exits 6 when the health file is missing, unreadable or stale (linkpassd gone),
    7 when no port is usable (stdout stays empty), 2 on a bad option, including
    a malformed NCCL version or one older than 2.29.7.
    """
    ctx = click.get_current_context()
    if failover_version is None and \
            ctx.get_parameter_source("merge_size") is not click.core.ParameterSource.DEFAULT:
        raise click.UsageError("--merge-size applies only with --port-failover", ctx=ctx)
    try:
        doc = HealthFile(path).read()
    except HealthFileError as exc:
        raise NcclEnvError(str(exc), ExitCode.STALE) from None
    # In a container (another PID namespace) doc.pid names another process
    # or none: kill(pid, 0) would call a live daemon gone.
    check_pid = not no_pid_check and healthdoc.pid_comparable(doc, own_pid_namespace())
    alive = pid_alive(doc.pid) if check_pid else None
    stale = healthdoc.staleness(doc, time.time(), alive, show_time=local_iso)
    if stale is not None:
        raise NcclEnvError(f"{path}: {stale}", ExitCode.STALE)
    env = healthdoc.nccl_env(doc)
    if not env:
        raise NcclEnvError(healthdoc.nccl_env_refusal(doc) or "no usable port", ExitCode.NO_USABLE)
    notes: list[str] = []
    if failover_version is not None:
        extra, notes = healthdoc.port_failover_env(doc, merge_size)
        env.update(extra)
    terminal.echo(render(env, doc, fmt))
    for note in notes:
        terminal.echo(f"linkpassctl: nccl-env: note: {note}", err=True)
