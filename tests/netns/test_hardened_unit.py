"""linkpassd under the restrictions of its own unit, systemd/linkpassd.service,
reproduced by hand (there is no systemd as PID 1 here):

  * the unit file is parsed, so the test follows the unit: its capability
    bounding, inheritable and ambient sets (`setpriv`), NoNewPrivileges=,
    SupplementaryGroups=, and ProtectSystem=strict with only the
    StateDirectory=, RuntimeDirectory= and ReadWritePaths= writable,
    PrivateTmp= and ProtectKernelTunables= (`unshare -m` and bind mounts:
    tests/netns/_hardened_exec.py). /var/lib/<StateDirectory> and
    /run/<RuntimeDirectory> are stand-in directories under /run/lp-hardened-*,
    created as systemd would (root's, the unit's modes), and the daemon's
    config points at them;
  * through a cable pull and a restart (the cable mended while the daemon is
    stopped, so only what it wrote can keep the port out of service), a drain
    and a verdict survive, and nothing is refused on the way.

Not reproduced: ProtectHome= (the test venv's interpreter lives under /root),
the system call filter and address family restrictions (no seccomp tool
here), PrivateDevices= and the other kernel-facing Protect*= settings, and
LimitRTPRIO= (raising RLIMIT_RTPRIO takes CAP_SYS_RESOURCE, which a container's
root may lack); tests/unit/test_systemd_units.py checks that the unit lets the
responder have the priority that limit allows.
"""

from __future__ import annotations

import ast
import contextlib
import grp
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from labs.daemonproc import DaemonProcess, rail_config_toml
from labs.netnslib import HostLab, wait_for_sync

pytestmark = pytest.mark.netns

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "linkpassd.service"
HELPER = Path(__file__).with_name("_hardened_exec.py")
HOLD_DOWN_S = 3.0  # long enough to look at a carried verdict right after the restart
CONTROL_GROUP = "linkpass"  # [daemon] control_group's default; the package creates it


def service_settings(path: Path) -> dict[str, list[str]]:
    """The [Service] section's assignments, each key's values in order."""
    settings: dict[str, list[str]] = {}
    section = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def one(settings: dict[str, list[str]], key: str, default: str = "") -> str:
    values = settings.get(key, [default])
    assert len(values) == 1, f"{UNIT.name}: one {key}= expected, found {values}"
    return values[0]


def words(settings: dict[str, list[str]], key: str) -> list[str]:
    return [w for value in settings.get(key, []) for w in value.split()]


def yes(value: str) -> bool:
    return value.lower() in ("yes", "true", "1", "on")


def setpriv_caps(names: list[str]) -> str:
    """CAP_NET_ADMIN CAP_NET_RAW -> -all,+net_admin,+net_raw"""
    return ",".join(["-all", *(f"+{n.lower().removeprefix('cap_')}" for n in names)])


class UnitSandbox:
    """What the unit gives linkpassd, with the unit's absolute paths mapped
    into a stand-in root: `path("/var/lib/linkpass")`."""

    def __init__(self, unit: Path, root: Path) -> None:
        s = service_settings(unit)
        self.root = root
        self.settings = s
        self.state_dirs = [f"/var/lib/{d}" for d in words(s, "StateDirectory")]
        self.runtime_dirs = [f"/run/{d}" for d in words(s, "RuntimeDirectory")]
        self.state_mode = int(one(s, "StateDirectoryMode", "0755"), 8)
        self.runtime_mode = int(one(s, "RuntimeDirectoryMode", "0755"), 8)
        self.writable = [*self.state_dirs, *self.runtime_dirs,
                         *(p.lstrip("-") for p in words(s, "ReadWritePaths"))]
        self.groups = words(s, "SupplementaryGroups")
        assert one(s, "ProtectSystem") == "strict", "the sandbox reproduces ProtectSystem=strict"
        assert "User" not in s and "DynamicUser" not in s, "the sandbox runs the daemon as root"

    def path(self, unit_path: str) -> Path:
        return self.root / unit_path.lstrip("/")

    def create_directories(self) -> None:
        """As systemd does before ExecStart: root's, with the unit's modes."""
        for d in self.state_dirs:
            self.path(d).mkdir(parents=True, exist_ok=True)
            os.chmod(self.path(d), self.state_mode)
        for d in self.runtime_dirs:
            self.path(d).mkdir(parents=True, exist_ok=True)
            os.chmod(self.path(d), self.runtime_mode)

    def program(self, *command: str) -> list[str]:
        """argv that runs `command` the way the unit would run it."""
        s = self.settings
        wrap = ["unshare", "--mount", "--propagation", "private", sys.executable, str(HELPER)]
        for w in self.writable:
            wrap += ["--writable", str(self.path(w))]
        if yes(one(s, "PrivateTmp", "no")):
            wrap.append("--private-tmp")
            # The checkout and its venv stand in for /opt/linkpass: kept
            # visible if they live under /tmp (a CI clone may).
            for tree in (REPO, Path(sys.prefix), Path(sys.base_prefix)):
                wrap += ["--keep", str(tree)]
        if yes(one(s, "ProtectKernelTunables", "no")):
            wrap.append("--protect-kernel-tunables")
        priv = ["setpriv", f"--bounding-set={setpriv_caps(words(s, 'CapabilityBoundingSet'))}",
                f"--inh-caps={setpriv_caps(words(s, 'AmbientCapabilities'))}",
                f"--ambient-caps={setpriv_caps(words(s, 'AmbientCapabilities'))}"]
        if self.groups:
            priv.append(f"--groups={','.join(self.groups)}")
        if yes(one(s, "NoNewPrivileges", "no")):
            priv.append("--no-new-privs")
        return [*wrap, "--", *priv, *command]


@pytest.fixture
def sandbox():
    """The unit's sandbox over a stand-in root under /run (outside /tmp, which
    PrivateTmp= replaces). The control group and the unit's groups are
    created if missing (as the package's postinst does: with the group there,
    the daemon gives it the socket) and removed again if this test made them."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    root = Path(tempfile.mkdtemp(prefix="lp-hardened-", dir="/run"))
    made: list[str] = []
    try:
        box = UnitSandbox(UNIT, root)
        for group in dict.fromkeys([CONTROL_GROUP, *box.groups]):
            with contextlib.suppress(KeyError):
                grp.getgrnam(group)
                continue
            subprocess.run(["groupadd", "--system", group], check=True, timeout=30)
            made.append(group)
        box.create_directories()
        yield box
    finally:
        shutil.rmtree(root, ignore_errors=True)
        for group in made:
            subprocess.run(["groupdel", group], check=False, timeout=30)


def run_in(box: UnitSandbox, netns: str, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", netns, *box.program(sys.executable, "-c", code)],
                          capture_output=True, text=True, timeout=60)


def test_the_sandbox_is_the_units(netns_factory, sandbox):
    """The reproduction is real: outside the unit's directories nothing is
    writable, its own are, and the capabilities are the unit's."""
    ns = netns_factory("hu")
    assert sandbox.state_dirs == ["/var/lib/linkpass"], "the unit's StateDirectory= is linkpass"
    assert sandbox.runtime_dirs == ["/run/linkpass"], "the unit's RuntimeDirectory= is linkpass"
    state = sandbox.path(sandbox.state_dirs[0])
    probe = f"""
import os, sys
def writes(d):
    try:
        p = os.path.join(d, ".lp-probe"); open(p, "w").close(); os.unlink(p); return "ok"
    except OSError as exc:
        return exc.strerror
status = dict(l.split(":\\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\\t" in l)
print(repr({{"state": writes({str(state)!r}), "etc": writes("/etc"), "var": writes("/var"),
             "run": writes("/run"), "tmp": writes("/tmp"), "bnd": status["CapBnd"].strip(),
             "eff": status["CapEff"].strip(), "nnp": status["NoNewPrivs"].strip(),
             "groups": sorted(os.getgroups())}}))
"""
    proc = run_in(sandbox, ns.name, probe)
    assert proc.returncode == 0, proc.stderr
    seen = ast.literal_eval(proc.stdout)  # our own repr: a dict of str and a list of int
    assert seen["state"] == "ok" and seen["tmp"] == "ok", seen
    assert seen["etc"] == seen["var"] == seen["run"] == "Read-only file system", seen
    net_admin_raw = (1 << 12) | (1 << 13)  # CAP_NET_ADMIN, CAP_NET_RAW
    assert int(seen["bnd"], 16) == int(seen["eff"], 16) == net_admin_raw, seen
    assert seen["nnp"] == "1"
    assert [grp.getgrnam(g).gr_gid for g in sandbox.groups] == \
        [g for g in seen["groups"] if g != 0], seen


def ctl(sock: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "linkpassd.ctl.main", "--socket", sock, *args],
                          capture_output=True, text=True, timeout=30, cwd=REPO)


def port_state(status: dict, port: str) -> dict:
    return next(p for p in status["ports"] if p["port"] == port)


def table_of(status: dict, rail: str) -> int:
    return next(r["table"] for r in status["rails"] if r["name"] == rail)


def nexthop_of(host, port: str) -> int:
    return next(n["id"] for n in host.ipj("nexthop", "show") if n.get("dev") == port)


REFUSALS = ("Read-only file system", "Permission denied", "Operation not permitted", "Traceback")


def test_a_drain_and_a_verdict_survive_a_cable_pull_and_a_restart_under_the_unit(
        netns_factory, sandbox, tmp_path):
    lab = HostLab.build(netns_factory, n_rails=3)
    rail0, rail1, rail2 = lab.rails
    state_dir = sandbox.path("/var/lib/linkpass")
    run_dir = sandbox.path("/run/linkpass")
    sock = str(run_dir / "linkpassd.sock")
    cfg = sandbox.path("/etc/linkpass/linkpassd.toml")
    cfg.parent.mkdir(parents=True)
    cfg.write_text(rail_config_toml(sock, str(run_dir), lab.rails, rise=2, hold_down_s=HOLD_DOWN_S,
                                    state_dir=str(state_dir)))
    log = tmp_path / "linkpassd.log"
    program = sandbox.program(sys.executable, "-m", "linkpassd.daemon")

    with DaemonProcess(lab.host.name, cfg, sock, log, program=program) as first:
        st = first.wait_ready()
        mode = os.stat(sock)
        assert stat.S_IMODE(mode.st_mode) == 0o660, oct(mode.st_mode)
        assert mode.st_gid == grp.getgrnam(CONTROL_GROUP).gr_gid  # given without CAP_CHOWN
        table0, table2 = table_of(st, "rail0"), table_of(st, "rail2")
        nh0, nh1 = nexthop_of(lab.host, rail0.port), nexthop_of(lab.host, rail1.port)
        drained = ctl(sock, "drain", rail2.port, "--reason", "optic swap, ticket 7")
        assert drained.returncode == 0, drained.stdout + drained.stderr
        assert lab.host.route_nhid(table2) in (nh0, nh1)  # off the drained port
        lab.cut(rail0)
        wait_for_sync(lambda: lab.host.route_nhid(table0) == nh1, 5.0, "rail0 failed over to rail1")
        wait_for_sync(lambda: port_state(first.status(), rail0.port)["verdict"] == "VERDICT_DOWN",
                      5.0, "rail0 judged down")
        wait_for_sync(lambda: (state_dir / "verdicts.json").exists()
                      and rail0.port in (state_dir / "verdicts.json").read_text(), 5.0,
                      "the verdict written")
        assert rail2.port in json.dumps(json.loads((state_dir / "drains.json").read_text()))
        assert first.stop() == 0
    lab.restore(rail0)  # mended while the daemon is away: only its files remember
    wait_for_sync(lambda: lab.host.has_carrier(rail0.port), 3.0, "carrier back on rail0")

    with DaemonProcess(lab.host.name, cfg, sock, log, program=program) as again:
        st = again.wait_ready()
        port0 = port_state(st, rail0.port)
        assert port0["verdict"] != "VERDICT_UP", port0
        assert "before restart" in " ".join(port0["evidence"]), port0
        assert lab.host.route_nhid(table0) == nh1  # still on its backup
        port2 = port_state(st, rail2.port)
        assert port2["drain"]["reason"] == "optic swap, ticket 7", port2
        assert port2["verdict"] == "VERDICT_DEGRADED", port2
        assert lab.host.route_nhid(table2) != nexthop_of(lab.host, rail2.port)
        # its own evidence brings rail0 back, after rise and the hold-down
        wait_for_sync(lambda: lab.host.route_nhid(table0) == nh0, HOLD_DOWN_S + 10.0,
                      "rail0 back on its own path")
        assert port_state(again.status(), rail0.port)["verdict"] == "VERDICT_UP"
        assert again.stop() == 0
    text = log.read_text(errors="replace")
    refused = [line for line in text.splitlines() if any(r in line for r in REFUSALS)]
    assert not refused, "\n".join(refused)
