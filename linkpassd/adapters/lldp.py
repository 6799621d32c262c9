"""LLDP neighbours of this host's ports: from lldpd when it runs, else off the wire.

Fleet validation (linkpassd.adapters.hostcheck) compares each port's LLDP
neighbour with the cabling plan. Two sources, in this order:

- lldpd, through its client: ``lldpctl -u SOCKET -f json0``. lldpd 1.0.16's
  ``-f json`` output changes shape with the data: ``interface`` is an object
  keyed by port when one port has a neighbour and a list of one-key objects
  when several do, and ``chassis`` is keyed by the system name when there is
  one and holds ``id`` directly when there is none (a system named "id"
  would be ambiguous). ``json0`` always uses lists of objects, so we ask for
  it; `parse_lldpctl` reads both shapes, since an operator may hand us either
  (tests/unit/lldp_fixtures holds real 1.0.16 output of each).
- the wire: the first LLDP frame (ethertype 0x88cc) received on the port,
  read from a packet socket opened in the port's namespace and dissected
  with scapy's LLDP layer (scapy.contrib.lldp). LLDP frames come every 30 s
  by default, so the wait is bounded by the caller's window.

Which port name is compared with the plan (`LldpNeighbour.switch_port`): the
port ID when its subtype names the port (interface name, local, alias),
otherwise (a MAC address or network address says nothing a plan holds) the
port description, as switches put the front-panel name there.

Nothing here raises on what it reads: a malformed document, an unknown
shape, a truncated frame or a missing lldpctl is a named problem.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
from dataclasses import dataclass
from typing import Any

ETH_P_LLDP = 0x88CC
PACKET_OUTGOING = 4  # sll_pkttype of a frame this host sent (we see our own lldpd's)
DEFAULT_LLDPD_SOCKET = "/run/lldpd.sock"  # lldpd's own default (Debian, upstream)
LLDPCTL_TIMEOUT_S = 5.0
MAX_OUTPUT_BYTES = 8 << 20
_FRAME_BYTES = 9216
# Port ID subtypes (IEEE 802.1AB) and lldpctl's names for them that name a port.
_NAMING_SUBTYPES = {"ifname", "local", "ifalias"}
# Port ID subtype numbers (802.1AB 8.5.3) -> the names lldpctl prints, so both sources agree.
_PORT_ID_SUBTYPES = {1: "ifalias", 2: "component", 3: "mac", 4: "ip", 5: "ifname",
                     6: "circuit", 7: "local"}


@dataclass(frozen=True)
class LldpNeighbour:
    """What one port's neighbour says of itself. `source`: "lldpd" or "wire"."""

    port: str  # our port
    system: str  # the neighbour's system name ("" when it sends none)
    port_id: str
    port_id_type: str  # lldpctl's or scapy's name of the subtype, e.g. "ifname", "mac"
    port_descr: str
    source: str

    @property
    def switch_port(self) -> str:
        """The neighbour's port as a cabling plan names it (module docstring)."""
        if self.port_id_type.lower() in _NAMING_SUBTYPES or not self.port_descr:
            return self.port_id
        return self.port_descr


@dataclass(frozen=True)
class LldpdView:
    """lldpd's neighbours by our port (the first one of each), or why there are none."""

    neighbours: dict[str, LldpNeighbour]
    problem: str = ""


# --------------------------------------------------------------------------
# lldpctl JSON
# --------------------------------------------------------------------------


class _Bad(Exception):
    pass


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string"}.get(type(value),
                                                                      type(value).__name__)


def _entries(value: Any, where: str) -> list[tuple[str | None, dict]]:
    """An lldpctl container as (key, object) pairs: json's {name: {...}} or
    [{name: {...}}, ...], or json0's [{"name": ..., ...}] (key None)."""
    if isinstance(value, dict):
        return [(k, v) for k, v in value.items() if isinstance(v, dict)] \
            if all(isinstance(v, dict) for v in value.values()) else [(None, value)]
    if isinstance(value, list):
        out: list[tuple[str | None, dict]] = []
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                raise _Bad(f"{where}[{i}] is {_kind(item)}, not an object")
            if len(item) == 1 and isinstance(next(iter(item.values())), dict) \
                    and "name" not in item:
                key, body = next(iter(item.items()))
                out.append((key, body))
            else:
                out.append((None, item))
        return out
    raise _Bad(f"{where} is {_kind(value)}, not an object or array")


def _text(value: Any) -> str:
    """A json leaf ("x"), a json0 leaf ([{"value": "x"}]) or an object with "value"."""
    if isinstance(value, list):
        value = value[0] if value else ""
    if isinstance(value, dict):
        value = value.get("value", "")
    return value if isinstance(value, str) else ""


def _port_id(port: dict) -> tuple[str, str]:
    pid = port.get("id", {})
    if isinstance(pid, list):
        pid = pid[0] if pid else {}
    if not isinstance(pid, dict):
        return _text(pid), ""
    return _text(pid.get("value", "")), _text(pid.get("type", ""))


def _chassis_name(chassis: Any, where: str) -> str:
    if isinstance(chassis, list):  # json0: [{"id": [...], "name": [{"value": ...}], ...}]
        first = chassis[0] if chassis else {}
        return _text(first.get("name", "")) if isinstance(first, dict) else ""
    if not isinstance(chassis, dict):
        raise _Bad(f"{where}.chassis is {_kind(chassis)}, not an object or array")
    if "id" in chassis or "descr" in chassis:  # json, a chassis without a name
        return _text(chassis.get("name", ""))
    if len(chassis) == 1:  # json: keyed by the system name
        return next(iter(chassis))
    return ""


def parse_lldpctl(data: bytes | str) -> LldpdView:
    """lldpctl's ``-f json`` or ``-f json0`` output -> neighbours by port.
    Never raises: a malformed document is an empty view with the problem named."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        return LldpdView({}, f"lldpctl output is not JSON: {exc}")
    try:
        return LldpdView(_neighbours(doc))
    except _Bad as exc:
        return LldpdView({}, f"lldpctl output: {exc}")
    except (AttributeError, TypeError, IndexError, KeyError) as exc:
        return LldpdView({}, f"lldpctl output has an unexpected shape: {exc!r}")


def _neighbours(doc: Any) -> dict[str, LldpNeighbour]:
    if not isinstance(doc, dict) or "lldp" not in doc:
        raise _Bad(f"the document is {_kind(doc)} without an 'lldp' key")
    lldp = doc["lldp"]
    if isinstance(lldp, list):  # json0: [{"interface": [...]}]
        blocks = lldp
    else:
        blocks = [lldp]
    out: dict[str, LldpNeighbour] = {}
    for block in blocks:
        if not isinstance(block, dict):
            raise _Bad(f"lldp is {_kind(block)}, not an object")
        if "interface" not in block:
            continue  # no neighbour anywhere
        for key, body in _entries(block["interface"], "lldp.interface"):
            port = key if key is not None else _text(body.get("name", ""))
            if not port:
                raise _Bad("an lldp.interface entry has no name")
            where = f"lldp.interface[{port!r}]"
            chassis = body.get("chassis", {})
            ports = body.get("port", {})
            if isinstance(ports, list):
                ports = ports[0] if ports else {}
            if not isinstance(ports, dict):
                raise _Bad(f"{where}.port is {_kind(ports)}, not an object")
            port_id, port_type = _port_id(ports)
            out.setdefault(port, LldpNeighbour(
                port=port, system=_chassis_name(chassis, where), port_id=port_id,
                port_id_type=port_type, port_descr=_text(ports.get("descr", "")),
                source="lldpd"))
    return out


async def query_lldpd(socket_path: str = DEFAULT_LLDPD_SOCKET,
                      timeout_s: float = LLDPCTL_TIMEOUT_S) -> LldpdView:
    """Ask the lldpd behind `socket_path`. No socket, no lldpctl, a failing or
    slow lldpctl: an empty view saying why (the caller reads the wire)."""
    if not os.path.exists(socket_path):
        return LldpdView({}, f"no lldpd socket at {socket_path}")
    lldpctl = shutil.which("lldpctl")
    if lldpctl is None:
        return LldpdView({}, "lldpctl is not installed")
    try:
        proc = await asyncio.create_subprocess_exec(
            lldpctl, "-u", socket_path, "-f", "json0", stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    except OSError as exc:
        return LldpdView({}, f"cannot run lldpctl: {exc}")
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()  # ours, by its handle
        await proc.wait()
        return LldpdView({}, f"lldpctl -u {socket_path} did not answer within {timeout_s:g} s")
    except asyncio.CancelledError:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    if proc.returncode != 0:
        why = err.decode(errors="replace").strip().splitlines()
        return LldpdView({}, f"lldpctl -u {socket_path} failed (exit {proc.returncode}): "
                             f"{why[-1] if why else 'no message'}"[:500])
    if len(out) > MAX_OUTPUT_BYTES:
        return LldpdView({}, f"lldpctl output exceeds {MAX_OUTPUT_BYTES} bytes")
    return parse_lldpctl(out)


# --------------------------------------------------------------------------
# The wire
# --------------------------------------------------------------------------


class ScapyMissing(Exception):
    """scapy (the labs extra) is not installed: frames cannot be dissected."""


def _scapy_layers():
    try:
        from scapy.contrib import lldp
        from scapy.layers.l2 import Ether
    except ImportError as exc:
        raise ScapyMissing(f"scapy is not installed ({exc}): LLDP frames cannot be read") from exc
    return Ether, lldp


def parse_frame(data: bytes, port: str) -> tuple[LldpNeighbour | None, str]:
    """One received Ethernet frame -> the neighbour it announces, or None and
    why not. Never raises on the frame (scapy's own errors included)."""
    Ether, lldp = _scapy_layers()
    if len(data) < 14:
        return None, f"a frame of {len(data)} bytes is too short for Ethernet"
    try:
        frame = Ether(data)
        if frame.type != ETH_P_LLDP or not frame.haslayer(lldp.LLDPDU):
            return None, f"not an LLDP frame (ethertype {frame.type:#06x})"
        system = frame.getlayer(lldp.LLDPDUSystemName)
        pid = frame.getlayer(lldp.LLDPDUPortID)
        descr = frame.getlayer(lldp.LLDPDUPortDescription)
        if pid is None:
            return None, "an LLDP frame without a port ID TLV"
        subtype = _PORT_ID_SUBTYPES.get(pid.subtype, f"subtype {pid.subtype}")
        if pid.subtype == 3 and isinstance(pid.id, str):  # MAC address, scapy gives text
            port_id = pid.id
        else:
            port_id = _decode(pid.id)
        return LldpNeighbour(
            port=port, system=_decode(system.system_name) if system is not None else "",
            port_id=port_id, port_id_type=subtype,
            port_descr=_decode(descr.description) if descr is not None else "",
            source="wire"), ""
    except Exception as exc:  # noqa: BLE001 - scapy raises anything on a broken frame
        return None, f"an undecodable LLDP frame: {exc!r}"[:300]


def _decode(value) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return "" if value is None else str(value)


def _packet_socket(port: str, netns: str | None) -> socket.socket:
    proto = socket.htons(ETH_P_LLDP)
    if netns is None:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, proto)
    else:
        from pyroute2.netns import create_socket
        sock = create_socket(netns, socket.AF_PACKET, socket.SOCK_RAW, proto, flags=0)
    try:
        sock.bind((port, ETH_P_LLDP))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


# How sniff_lldp says it listened for the whole window and heard no neighbour:
# a result (the check ran), unlike its other reasons (it could not listen).
HEARD_NOTHING = "no LLDP frame within"


def heard_nothing(why: str) -> bool:
    """Whether sniff_lldp's `why` is a check that ran and saw no neighbour."""
    return why.startswith(HEARD_NOTHING)


async def sniff_lldp(port: str, timeout_s: float, netns: str | None = None
                     ) -> tuple[LldpNeighbour | None, str]:
    """The first LLDP neighbour heard on `port` within `timeout_s`, or None and
    why not (named: no frame, no such port, no scapy). Frames this host sent
    (its own lldpd's) are skipped. Needs CAP_NET_RAW."""
    try:
        await asyncio.to_thread(_scapy_layers)  # the first import, off the loop
    except ScapyMissing as exc:
        return None, str(exc)
    try:
        sock = _packet_socket(port, netns)
    except OSError as exc:
        return None, f"cannot read LLDP frames on {port}: {exc.strerror or exc}"
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    loop.add_reader(sock.fileno(), ready.set)
    last_problem = ""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                await ready.wait()
                ready.clear()
                for _ in range(64):
                    try:
                        data, address = sock.recvfrom(_FRAME_BYTES)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError as exc:  # the port went away meanwhile
                        return None, f"reading LLDP frames on {port}: {exc.strerror or exc}"
                    if len(address) > 2 and address[2] == PACKET_OUTGOING:
                        continue
                    neighbour, problem = parse_frame(data, port)
                    if neighbour is not None:
                        return neighbour, ""
                    last_problem = problem
    except TimeoutError:
        why = f"{HEARD_NOTHING} {timeout_s:.0f} s on {port}"
        return None, f"{why} (last frame: {last_problem})" if last_problem else why
    finally:
        loop.remove_reader(sock.fileno())
        sock.close()
