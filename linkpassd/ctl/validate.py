"""`linkpassctl validate`: prove every cable, optic and path of the fleet
against a cabling plan, through linkpass-aggregator (issue 13).

The plan is read and checked here first (linkpassd.validate.plan), so a typo
in the file is exit 2 naming the file, entry and key before anything runs on
a host. The aggregator runs every selected host at once and streams progress
(a bar on stderr, so stdout stays the report) and then the report, which is
printed with linkpassd.validate.report: terminal summary or JSON, and
optionally a PNG heatmap.

Exit codes (linkpassd/exitcodes.py): 0 no finding; 8 (FINDINGS) the report has a
finding (a host that gave no result counts: it was not proven); 2 a bad
argument or plan; 3 aggregator unreachable; 4 refused (Validate needs an
operator certificate); 1 anything else, e.g. another validation is running.
Connection options are those of `linkpassctl fleet` (and its environment
variables).
"""

from __future__ import annotations

import sys

import click
import grpc

from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd._proto.linkpass.v1 import fleet_pb2_grpc as pb_grpc
from linkpassd.ctl import terminal
from linkpassd.ctl.fleet import Aggregator, FleetError, aggregator_from_options
from linkpassd.ctl.fleet import fleet as fleet_group
from linkpassd.exitcodes import ExitCode
from linkpassd.validate import plan as cabling

# The aggregator gives up on a host at its window + 15 s; past this much more
# without a report, the aggregator itself is stuck.
STREAM_SLACK_S = 60.0
DEFAULT_DURATION_S = 30.0  # the aggregator's default window (validation.DEFAULT_DURATION_S)

EPILOG = """\b
Exit codes: 0 no finding; 8 the report has findings (a miswire, a bad optic, a
lossy or blackholing link, a host that gave no result, ...); 2 bad argument or
plan; 3 aggregator unreachable; 4 refused (needs an operator certificate);
1 other failure (e.g. another validation is running)."""


def _names(text: str, option: str) -> list[str]:
    """'a,b' -> ['a', 'b']; an empty item (a stray comma) is a usage error naming the option."""
    if not text:
        return []
    items = [item.strip() for item in text.split(",")]
    if any(not item for item in items):
        raise click.BadParameter(f"{text!r} has an empty name (stray comma?)", param_hint=f"'{option}'")
    return list(dict.fromkeys(items))


def _load_plan(path: str, hosts: list[str], rails: list[str]) -> cabling.CablingPlan:
    """The plan, checked, and the --hosts/--rails it must contain (exit 2 naming what is wrong)."""
    try:
        loaded = cabling.load(path)
    except cabling.PlanError as exc:
        raise FleetError(str(exc), ExitCode.USAGE) from None
    plan_hosts = {p.host for p in loaded.ports}
    plan_rails = {p.rail for p in loaded.ports}
    missing = [h for h in hosts if h not in plan_hosts]
    if missing:
        raise click.BadParameter(f"not in the plan {path}: {', '.join(missing)}", param_hint="'--hosts'")
    missing = [r for r in rails if r not in plan_rails]
    if missing:
        raise click.BadParameter(f"not in the plan {path}: {', '.join(missing)} "
                                 f"(it has {', '.join(sorted(plan_rails))})", param_hint="'--rails'")
    return loaded


def run_validation(agg: Aggregator, request: pb.ValidateRequest) -> pb.ValidationReport:
    """Stream Validate with a progress bar on stderr; the report."""
    duration = request.duration_s or DEFAULT_DURATION_S
    report: pb.ValidationReport | None = None
    bar = None
    try:
        with agg.channel() as channel:
            responses = pb_grpc.FleetServiceStub(channel).Validate(request, timeout=duration + STREAM_SLACK_S)
            try:
                for response in responses:
                    if response.HasField("report"):
                        report = response.report
                        continue
                    progress = response.progress
                    if bar is None:
                        bar = click.progressbar(length=max(progress.hosts_total, 1), label="validating",
                                                file=sys.stderr, show_pos=True,
                                                item_show_func=lambda h: terminal.safe(h, one_line=True) if h else h)
                        bar.__enter__()
                    bar.update(progress.hosts_done - bar.pos, progress.last_host or None)
            finally:
                responses.cancel()
    except grpc.RpcError as exc:
        raise agg.failure(exc) from None
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    if report is None:
        raise FleetError("linkpass-aggregator ended the validation without a report", ExitCode.UNREACHABLE)
    return report


@click.command("validate", epilog=EPILOG)
@click.option("--plan", "plan_path", required=True, metavar="FILE",
              help="The cabling plan (TOML: [[port]] host, port, switch, switch_port, rail, speed_mbps).")
@click.option("--hosts", default="", metavar="H1,H2", help="Only these hosts of the plan [default: all].")
@click.option("--rails", default="", metavar="R1,R2", help="Only these rails of the plan [default: all].")
@click.option("--duration", type=click.FloatRange(min=1, max=600), default=None, metavar="SECONDS",
              help=f"The window on each host [default: the aggregator's, {DEFAULT_DURATION_S:g}].")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="table for people, json (the ValidationReport message) for scripts.")
@click.option("--png", metavar="FILE", default=None, help="Also draw the heatmap (hosts x rails, leaf x leaf) here.")
@click.pass_context
def validate(ctx: click.Context, plan_path: str, hosts: str, rails: str, duration: float | None, output: str,
             png: str | None, address: str | None, ca: str | None, cert: str | None, key: str | None,
             insecure: bool, server_name: str) -> None:
    """Check every selected host against the cabling plan, all at once
    through linkpass-aggregator: ports up at their speed, optics, error
    counters, LLDP neighbours, and probes on every rail between host pairs;
    then name what is at fault. Needs an operator certificate."""
    from linkpassd.validate import report as reporting  # matplotlib behind it: only when validating

    host_names = _names(hosts, "--hosts")
    rail_names = _names(rails, "--rails")
    loaded = _load_plan(plan_path, host_names, rail_names)
    agg = aggregator_from_options(ctx, address, ca, cert, key, insecure, server_name)
    request = pb.ValidateRequest(plan=[cabling.to_proto(p) for p in loaded.ports], hosts=host_names,
                                 rails=rail_names, duration_s=duration or 0.0)
    report = run_validation(agg, request)
    terminal.echo(reporting.to_json(report) if output == "json" else reporting.render_text(report))
    if png:
        try:
            reporting.write_png(report, png, plan=loaded)
        except ImportError:
            raise FleetError(f"--png {png}: drawing needs matplotlib (pip install matplotlib); "
                             "the report above is complete", ExitCode.FAILURE) from None
        except OSError as exc:
            raise FleetError(f"--png {png}: {exc.strerror or exc}", ExitCode.FAILURE) from None
    code = reporting.exit_code(report)  # FINDINGS also when a host gave no result: it was not proven
    if code:
        ctx.exit(code)


# The connection options of `linkpassctl fleet`, shared rather than copied, so
# both commands read the same flags and environment variables.
CONNECTION_OPTIONS = ("address", "ca", "cert", "key", "insecure", "server_name")
validate.params.extend(p for p in fleet_group.params if p.name in CONNECTION_OPTIONS)
