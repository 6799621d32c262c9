"""Issue 30, item 7: host-supplied text (messages, port and rail names,
evidence, paths, host ids) reached the operator's terminal raw in
`linkpassctl fleet` and `fleet events`: an OSC retitled the window, CSI 2J
cleared the screen. Every control character is now printed as its escape."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from linkpassd._proto.linkpass.v1 import control_pb2 as cpb
from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd.ctl import fleet as ctl_fleet
from linkpassd.ctl import render

OSC_TITLE = "\x1b]0;pwned\x07"
CLEAR = "\x1b[2J\x1b[H"
C1_CSI = "\x9b2J"
BIDI = "\u202eevil"
HOSTILE = f"a{OSC_TITLE}b{CLEAR}c{C1_CSI}d{BIDI}\r\nFAKE LINE"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _hostile_fleet() -> pb.ListHostsResponse:
    return pb.ListHostsResponse(hosts=[pb.HostView(
        host_id=f"h{OSC_TITLE}", connected=True,
        rails=[pb.RailInventory(rail=f"rail0{CLEAR}", port=f"eth1{C1_CSI}")],
        report=pb.PortReport(
            ports=[cpb.PortState(port=f"eth1{C1_CSI}", verdict=cpb.VERDICT_DOWN, evidence=[HOSTILE])],
            rail_paths={f"rail0{CLEAR}": HOSTILE}))])


def test_fleet_grid_escapes_every_control_character() -> None:
    out = ctl_fleet.render_grid(_hostile_fleet())
    assert not RAW.search(out.replace("\n", "")), repr(out)
    assert "\\x1b]0;pwned\\x07" in out and "\\x9b2J" in out and "\\u202e" in out
    assert "FAKE LINE" not in out.split("\n")[0]


def test_fleet_events_escape_every_control_character() -> None:
    fe = pb.FleetEvent(host_id=f"h{OSC_TITLE}", id=1, event=cpb.Event(
        boot_id="b", seq=1, kind=999, severity=77, port=f"eth1{CLEAR}", rail=f"r{C1_CSI}", message=HOSTILE))
    out = ctl_fleet.render_fleet_events([fe])
    assert not RAW.search(out), repr(out)
    assert len(out.splitlines()) == 1, "a newline in a message must not forge a second line"


def test_daemon_event_lines_and_tables_escape_too() -> None:
    e = cpb.Event(boot_id="b", seq=1, port=f"eth{CLEAR}", message=HOSTILE)
    assert not RAW.search(render.event_line(e))
    assert not RAW.search(render.table(["A", "B"], [[OSC_TITLE, HOSTILE]]).replace("\n", ""))


def test_safe_keeps_ordinary_text() -> None:
    from linkpassd.ctl.terminal import safe

    text = "rail0 eth1 198.18.0.1 ✓ 中文 naïve\nnext\tline"
    assert safe(text) == text
    assert safe(text, one_line=True) == "rail0 eth1 198.18.0.1 ✓ 中文 naïve\\x0anext\\x09line"


def test_linkpassctl_prints_only_through_the_terminal_helper() -> None:
    """One helper used everywhere: no module of linkpassctl calls click.echo
    (or print) itself, so no new command can forget to escape."""
    ctl = Path(render.__file__).parent
    offenders = []
    for path in sorted(ctl.glob("*.py")):
        if path.name == "terminal.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = (f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else "")
                owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
                if (owner, name) in (("click", "echo"), ("click", "secho"), ("", "print")):
                    offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []
