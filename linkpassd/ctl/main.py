"""linkpassctl: the operator CLI for the local linkpassd control socket.

Everything shown comes from the daemon's answer; ages and uptime are computed
from the time the daemon put in that answer (`served_at`), never from this
process's clock. Failures print one line on stderr and exit with a code a
script can branch on (linkpassd/exitcodes.py: daemon absent 3, refused 4, not found
5, bad argument 2): operators run this from scripts and during incidents,
where a traceback is noise.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

import click

# gRPC core logs connection failures straight to stderr; our own one-line
# errors say the same thing better. Must be set before gRPC initialises,
# so the imports below follow it (pyproject.toml lets this file have E402).
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import grpc

from linkpassd import __version__
from linkpassd._proto.linkpass.v1 import control_pb2 as pb
from linkpassd._proto.linkpass.v1 import control_pb2_grpc as pb_grpc
from linkpassd.core.drain import DrainError, parse_duration
from linkpassd.ctl import terminal
from linkpassd.ctl.fleet import fleet
from linkpassd.ctl.nccl import nccl_env
from linkpassd.ctl.render import (  # the renderers (to_json is also used by tests)
    _one_line,
    event_line,
    missed_warning,
    render_drain_change,
    render_events,
    render_explanation,
    render_fences,
    render_links,
    render_status,
    render_unfence,
    to_json,
)
from linkpassd.ctl.rpc import STATUS_EXIT, RpcTarget, status_of
from linkpassd.ctl.validate import validate
from linkpassd.exitcodes import ExitCode, epilog

DEFAULT_SOCKET = "/run/linkpass/linkpassd.sock"
DEFAULT_TIMEOUT_S = 5.0



class CtlError(click.ClickException):
    """An expected failure: one line on stderr, no traceback, and the exit
    code that says which kind of failure it was (ExitCode)."""

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILURE) -> None:
        super().__init__(message)
        self.exit_code = int(code)

    def show(self, file=None) -> None:
        terminal.echo(f"linkpassctl: {self.format_message()}", err=True)


@dataclass(frozen=True)
class Target(RpcTarget):
    socket_path: str
    timeout: float

    stub = pb_grpc.ControlServiceStub

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(f"unix:{os.path.abspath(self.socket_path)}")

    def before(self) -> None:
        self._check_socket()

    def failure(self, exc: grpc.RpcError) -> CtlError:
        """The one-line error, with its exit code, for a failed call or stream."""
        return CtlError(self._describe(exc), self._exit_code(exc))

    def _check_socket(self) -> None:
        path = self.socket_path
        absent, refused = ExitCode.UNREACHABLE, ExitCode.REFUSED
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise CtlError(f"linkpassd is not running? no socket at {path}", absent) from None
        except PermissionError:
            raise CtlError(f"permission denied reaching {path} (run as root or a member of its group)",
                           refused) from None
        except OSError as exc:
            raise CtlError(f"cannot reach {path}: {exc.strerror}", absent) from None
        if not stat.S_ISSOCK(st.st_mode):
            raise CtlError(f"{path} is not a socket", absent)
        if not os.access(path, os.W_OK):  # connect(2) needs write permission
            raise CtlError(f"permission denied on {path} (run as root or a member of its group)", refused)

    @staticmethod
    def _exit_code(exc: grpc.RpcError) -> ExitCode:
        code, details = status_of(exc)
        if code == grpc.StatusCode.UNAVAILABLE:
            return ExitCode.REFUSED if "permission denied" in details.lower() else ExitCode.UNREACHABLE
        return STATUS_EXIT.get(code, ExitCode.FAILURE)

    def _describe(self, exc: grpc.RpcError) -> str:
        code, details = status_of(exc)
        path = self.socket_path
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"linkpassd did not answer within {self.timeout:g}s on {path}"
        if code == grpc.StatusCode.UNAVAILABLE:
            low = details.lower()
            if "permission denied" in low:
                return f"permission denied on {path} (run as root or a member of its group)"
            if "connection refused" in low or "no such file" in low:
                return f"linkpassd is not running? nothing listens on {path}"
            return f"linkpassd unavailable on {path}: {_one_line(details)}"
        if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED,
                    grpc.StatusCode.INVALID_ARGUMENT):  # the daemon's message names what and why
            return _one_line(details)
        name = code.name if code is not None else "error"
        return f"linkpassd answered {name}: {_one_line(details)}"


# --------------------------------------------------------------------------
# commands
# --------------------------------------------------------------------------

output_option = click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="table for people, json (proto field names, fixed keys) for scripts.",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=epilog())
@click.option(
    "--socket",
    "socket_path",
    metavar="PATH",
    envvar="LINKPASS_SOCKET",
    default=DEFAULT_SOCKET,
    show_default=True,
    show_envvar=True,
    help="linkpassd control socket.",
)
@click.option(
    "--timeout",
    metavar="SECONDS",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for linkpassd to answer.",
)
@click.version_option(__version__, prog_name="linkpassctl")
@click.pass_context
def cli(ctx: click.Context, socket_path: str, timeout: float) -> None:
    """Query the local linkpassd."""
    ctx.obj = Target(socket_path, timeout)


@cli.command()
@output_option
@click.pass_obj
def status(target: Target, output: str) -> None:
    """Daemon summary, the path each rail's table uses, multipath groups."""
    resp = target.call(lambda stub: stub.GetStatus, pb.GetStatusRequest())
    terminal.echo(to_json(resp.status) if output == "json" else render_status(resp.status))


@cli.command()
@output_option
@click.pass_obj
def links(target: Target, output: str) -> None:
    """Per port: link state, flap counters, health verdict with evidence, optics
    against the module's levels, error counters and each health signal."""
    resp = target.call(lambda stub: stub.ListLinks, pb.ListLinksRequest())
    terminal.echo(to_json(resp) if output == "json" else render_links(resp))


@cli.command()
@click.argument("port")
@output_option
@click.pass_obj
def explain(target: Target, port: str, output: str) -> None:
    """Why PORT has its verdict, and what that did to every table and group using it."""
    resp = target.call(lambda stub: stub.ExplainPort, pb.ExplainPortRequest(port=port))
    terminal.echo(to_json(resp) if output == "json" else render_explanation(resp))


@cli.command()
@click.option("--after", type=click.IntRange(min=0), default=None, metavar="SEQ",
              help="Only events after this sequence number [default: the oldest held; "
                   "with --follow: the newest, so only new events are shown].")
@click.option("--limit", type=click.IntRange(min=1), default=None, metavar="N",
              help="At most N events (with --follow: stop after N).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing events as they happen; Ctrl-C ends.")
@click.option("--boot-id", default="", metavar="ID",
              help="The boot --after belongs to (boot_id of `events -o json`); fails when linkpassd has "
                   "restarted since, instead of silently mixing two boots' sequence numbers.")
@output_option
@click.pass_obj
def events(target: Target, after: int | None, limit: int | None, follow: bool, boot_id: str, output: str) -> None:
    """What linkpassd decided and did, oldest first: verdicts, path and group
    changes, drains, reloads, conflicts.  One line per event (local time with offset, seq,
    severity, kind, port/rail, message); json: the API's messages (with
    --follow one JSON document per line)."""
    if not follow:
        resp = target.call(lambda stub: stub.ListEvents,
                           pb.ListEventsRequest(after_seq=after or 0, limit=limit or 0, boot_id=boot_id))
        if output == "json":
            terminal.echo(to_json(resp))
            return
        if resp.missed:
            terminal.echo(f"linkpassctl: {missed_warning(resp.missed)}", err=True)
        terminal.echo(render_events(resp))
        return
    if after is None:  # from now on: after the newest event held
        after = target.call(lambda stub: stub.ListEvents, pb.ListEventsRequest(limit=1, boot_id=boot_id)).last_seq
    shown = 0
    stream = target.stream(lambda stub: stub.WatchEvents, pb.WatchEventsRequest(after_seq=after, boot_id=boot_id))
    try:
        for msg in stream:
            if msg.missed:
                terminal.echo(f"linkpassctl: {missed_warning(msg.missed)}", err=True)
            terminal.echo(to_json(msg, indent=None) if output == "json" else event_line(msg.event))
            shown += 1
            if limit is not None and shown >= limit:
                return
    except KeyboardInterrupt:  # the way to stop following: not an error
        return
    finally:
        stream.close()
    raise CtlError("linkpassd ended the event stream (it is stopping)", ExitCode.UNREACHABLE)


# Longer than the daemon's own wait for the pass (operations.COMMAND_TIMEOUT_S,
# 10 s), so a slow pass is answered by the daemon ("queued"), not by our deadline.
DRAIN_TIMEOUT_S = 15.0


@cli.command()
@click.argument("port")
@click.option("--reason", required=True, metavar="TEXT", help="Why, for the next person on call (required).")
@click.option("--for", "for_", metavar="DURATION", default=None,
              help="End the drain by itself after DURATION, e.g. 90s, 30m, 2h, 1d, 1h30m [default: until undrain].")
@output_option
@click.pass_obj
def drain(target: Target, port: str, reason: str, for_: str | None, output: str) -> None:
    """Take PORT out of service: it is judged DEGRADED (traffic leaves it while
    a healthy alternative exists; the answer says where it stays and why) until
    `undrain` or --for passes.  Draining a drained port replaces its drain:
    the new reason and --for (or none: until undrain) count from now, and the
    answer shows the drain it replaced.  Survives a daemon restart.  Needs
    root or linkpassd's admin_group."""
    duration_s = 0.0  # until undrained
    if for_ is not None:
        try:
            duration_s = parse_duration(for_)
        except DrainError as exc:
            raise click.BadParameter(str(exc), param_hint="'--for'") from None
    resp = target.call(lambda stub: stub.Drain, pb.DrainRequest(port=port, reason=reason, duration_s=duration_s),
                       at_least=DRAIN_TIMEOUT_S)
    terminal.echo(to_json(resp) if output == "json" else render_drain_change(
        resp.state, replaced=resp.replaced if resp.HasField("replaced") else None, notes=resp.notes))


@cli.command()
@click.argument("port")
@output_option
@click.pass_obj
def undrain(target: Target, port: str, output: str) -> None:
    """End PORT's drain: it is judged on its health again.  Needs root or
    linkpassd's admin_group."""
    resp = target.call(lambda stub: stub.Undrain, pb.UndrainRequest(port=port), at_least=DRAIN_TIMEOUT_S)
    terminal.echo(to_json(resp) if output == "json" else render_drain_change(resp.state, undrained=True))


@cli.command()
@output_option
@click.pass_obj
def fences(target: Target, output: str) -> None:
    """Each rail port's fence ([fence], docs/fencing.md): ARMED, CONFIRMING
    (DOWN with carrier; fenced once fence_after_s passes, unless held back),
    FENCED (administratively down until its test), TESTING (up, routes kept
    away, its own probes must say UP) or LIFTED (an operator's lift)."""
    resp = target.call(lambda stub: stub.ListFences, pb.ListFencesRequest())
    terminal.echo(to_json(resp) if output == "json" else render_fences(resp))


@cli.command()
@click.argument("port")
@click.option("--for", "for_", metavar="DURATION", default=None,
              help="Hold off another fence this long unless the port is trusted again first, "
                   "e.g. 30m, 2h [default: [fence] lift_hold_s].")
@output_option
@click.pass_obj
def unfence(target: Target, port: str, for_: str | None, output: str) -> None:
    """Lift PORT's fence: it is brought up at once, without proof, and not
    fenced again until it is trusted (UP) or the hold passes.  The routes
    still follow its health.  Needs root or linkpassd's admin_group."""
    hold_s = 0.0  # the config's lift_hold_s
    if for_ is not None:
        try:
            hold_s = parse_duration(for_)
        except DrainError as exc:
            raise click.BadParameter(str(exc), param_hint="'--for'") from None
    resp = target.call(lambda stub: stub.Unfence, pb.UnfenceRequest(port=port, hold_s=hold_s))
    terminal.echo(to_json(resp) if output == "json" else render_unfence(resp.fence))


cli.add_command(nccl_env)  # reads health.json, not the socket
cli.add_command(fleet)  # talks to linkpass-aggregator, not the socket
cli.add_command(validate)  # runs through linkpass-aggregator


PROG_NAME = "linkpassctl"


@cli.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the completion script for SHELL (install: see docs/operating.md, e.g.
    `linkpassctl completion bash > /etc/bash_completion.d/linkpassctl`).

    click's own machinery: the script calls `linkpassctl` back with
    `_LINKPASSCTL_COMPLETE` set, so completions always match this version's
    commands and options."""
    from click.shell_completion import get_completion_class

    complete_var = f"_{PROG_NAME.replace('-', '_').upper()}_COMPLETE"
    script_class = get_completion_class(shell)
    assert script_class is not None, shell  # click.Choice admits only shells click knows
    terminal.echo(script_class(cli, {}, PROG_NAME, complete_var).source())


def main() -> None:
    cli(prog_name=PROG_NAME)


if __name__ == "__main__":
    main()
