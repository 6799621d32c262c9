"""Health sensing over ethtool netlink and rtnetlink: why a link is down, how
often it went down, error and FEC counters, and raw module EEPROM pages.

pyroute2 0.9 parses only ETHTOOL_A_LINKSTATE_LINK and has no STATS_GET or
FEC_GET messages, so the messages used here are declared on pyroute2's own
marshalling (``genlmsg`` plus an ``nla_map``), with numbers from the kernel
UAPI: include/uapi/linux/ethtool_netlink_generated.h and ethtool.h as of
Linux 6.18 (Debian 12's 6.1 headers predate EXT_DOWN_CNT and STATS_SRC).
Every request carries its own reply parser (``NetlinkRequest(parser=...)``),
so one generic-netlink socket serves every message type without re-binding
the family to one class, as pyroute2's own ``AsyncNlEthtool`` does per call.

What comes back is never an exception:

* "not supported" (EOPNOTSUPP, or the kernel leaving an attribute out, as it
  does for everything veth lacks) is a normal answer: the field is None;
* any other failure of a counter read leaves that field None and logs a
  warning (once per port, request and reason, so a missing port does not
  flood the log every tick);
* any failure of a module read is ``Unreadable(reason)``.

Module EEPROM reads go through one lock per port and a minimum interval per
module: transceivers cannot serve concurrent readers (SONiC xcvrd, CDB), and
a read inside the interval answers from the cache, with its age.  Which pages
to read, and what they mean, is linkpassd.adapters.optics's business (pure
decoders); this module only moves the bytes.
"""

from __future__ import annotations

import asyncio
import errno as _errno
import os
import struct
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import structlog
from pyroute2 import AsyncIPRoute
from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST, genlmsg
from pyroute2.netlink.exceptions import NetlinkDecodeError, NetlinkError, NetlinkHeaderDecodeError
from pyroute2.netlink.generic import AsyncGenericNetlinkSocket
from pyroute2.netlink.nlsocket import NetlinkRequest

from linkpassd.adapters import optics as module_decoder
from linkpassd.adapters.ethtool_msgs import (
    EEPROM_HALF_PAGE,
    EEPROM_PAGE_LEN,
    ETHTOOL_A_STATS_ETH_MAC_6_FCS_ERR,
    ETHTOOL_A_STATS_ETH_PHY_5_SYM_ERR,
    ETHTOOL_FLAG_COMPACT_BITSETS,
    ETHTOOL_FLAG_STATS,
    ETHTOOL_GENL_NAME,
    ETHTOOL_GENL_VERSION,
    ETHTOOL_MSG_FEC_GET,
    ETHTOOL_MSG_LINKSTATE_GET,
    ETHTOOL_MSG_MODULE_EEPROM_GET,
    ETHTOOL_MSG_STATS_GET,
    ETHTOOL_STATS_CNT,
    ETHTOOL_STATS_ETH_MAC,
    ETHTOOL_STATS_ETH_PHY,
    ext_state_name,
    ext_substate_name,
    fec_msg,
    linkstate_msg,
    module_eeprom_msg,
    stats_msg,
)
from linkpassd.adapters.optics import PageRef
from linkpassd.core.model import CounterSample, OpticsReading, Unreadable

log = structlog.get_logger("linkpassd.ethtool")

T = TypeVar("T")

# include/uapi/linux/ethtool_netlink_generated.h (6.18)
# ----------------------------------------------------------------------
# module EEPROM: what to read, and who decodes it
# ----------------------------------------------------------------------


def check_page_ref(ref) -> str | None:
    """Why the kernel would refuse this read, or None.  Checked before
    sending so a caller's mistake is named, not an EINVAL.  A reference is
    anything with ``i2c``, ``bank``, ``page`` and ``offset`` (optics.PageRef),
    and optionally ``length`` (default: the rest of its half page)."""
    try:
        page, offset = int(ref.page), int(ref.offset)
        bank, address = int(ref.bank), int(ref.i2c)
        length = int(getattr(ref, "length", EEPROM_HALF_PAGE - offset % EEPROM_HALF_PAGE))
    except (AttributeError, TypeError, ValueError):
        return f"not a page reference: {ref!r}"
    if not 1 <= length <= EEPROM_HALF_PAGE:
        return f"length {length} not in 1..{EEPROM_HALF_PAGE}"
    if offset < 0 or offset + length > EEPROM_PAGE_LEN:
        return f"offset {offset} + length {length} outside the {EEPROM_PAGE_LEN}-byte page"
    if offset < EEPROM_HALF_PAGE < offset + length:
        return f"offset {offset} + length {length} crosses the half-page boundary"
    if offset < EEPROM_HALF_PAGE and (page or bank):
        return f"the lower half is page 0 bank 0, not page {page} bank {bank}"
    if not (0 <= page <= 255 and 0 <= bank <= 255 and 0 <= address <= 127):
        return f"page {page}, bank {bank} or i2c address {address:#x} out of range"
    return None


def _length(ref) -> int:
    return int(getattr(ref, "length", EEPROM_HALF_PAGE - int(ref.offset) % EEPROM_HALF_PAGE))


class ModuleDecoder(Protocol):
    """What ``optics()`` needs: linkpassd.adapters.optics's pure functions."""

    def identify(self, lower: bytes) -> str | Unreadable: ...

    def pages_needed(self, spec: str, lower: bytes) -> list[PageRef] | Unreadable: ...

    def decode(self, pages: Mapping[PageRef, bytes]) -> OpticsReading | Unreadable: ...


LOWER_PAGE0 = PageRef.lower()


@dataclass(frozen=True)
class Timed(Generic[T]):
    """A module answer with when it was read (sensor clock) and how old it is
    now; ``cached`` when it came from the rate limiter, not the module."""

    value: T
    read_at: float
    age_s: float
    cached: bool


# ----------------------------------------------------------------------
# normalisation: decoded messages -> CounterSample (pure, unit-tested)
# ----------------------------------------------------------------------


def _int_or_none(value) -> int | None:
    # pyroute2 hands back raw bytes for an attribute it failed to decode.
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def linkstate_fields(msg) -> dict[str, Any]:
    state = _int_or_none(msg.get_attr("ETHTOOL_A_LINKSTATE_EXT_STATE"))
    sub = _int_or_none(msg.get_attr("ETHTOOL_A_LINKSTATE_EXT_SUBSTATE"))
    return {
        "link_down_events": _int_or_none(msg.get_attr("ETHTOOL_A_LINKSTATE_EXT_DOWN_CNT")),
        "ext_state": ext_state_name(state) if state is not None else None,
        "ext_substate": ext_substate_name(state, sub) if state is not None and sub else None,
    }


def standard_stats(msg) -> dict[tuple[int, int], int]:
    """{(group id, counter id): value} from a STATS_GET reply."""
    out: dict[tuple[int, int], int] = {}
    for grp in msg.get_attrs("ETHTOOL_A_STATS_GRP"):
        if not hasattr(grp, "get_attrs"):
            continue  # undecodable nest
        group = _int_or_none(grp.get_attr("ETHTOOL_A_STATS_GRP_ID"))
        if group is None:
            continue
        for stat in grp.get_attrs("ETHTOOL_A_STATS_GRP_STAT"):
            if isinstance(stat, tuple) and len(stat) == 2:
                out[(group, stat[0])] = stat[1]
    return out


def fec_fields(msg) -> dict[str, int | None]:
    stats = msg.get_attr("ETHTOOL_A_FEC_STATS")
    if not hasattr(stats, "get_attr"):
        return {"fec_corrected": None, "fec_uncorrectable": None}

    def total(name):
        values = stats.get_attr(name)
        # An empty array means the driver did not set the counter.
        return _int_or_none(values[0]) if isinstance(values, (tuple, list)) and values else None

    return {
        "fec_corrected": total("ETHTOOL_A_FEC_STAT_CORRECTED"),
        "fec_uncorrectable": total("ETHTOOL_A_FEC_STAT_UNCORR"),
    }


def stats64_fields(msg) -> dict[str, int | None]:
    stats = msg.get_attr("IFLA_STATS64")
    if not hasattr(stats, "get"):  # absent, or raw bytes pyroute2 could not decode
        return {"rx_crc_errors": None, "length_errors": None, "rx_missed": None}
    return {
        "rx_crc_errors": _int_or_none(stats.get("rx_crc_errors")),
        "length_errors": _int_or_none(stats.get("rx_length_errors")),
        "rx_missed": _int_or_none(stats.get("rx_missed_errors")),
    }


def build_counter_sample(
    port: str,
    linkstate=None,
    stats=None,
    fec=None,
    link=None,
) -> CounterSample:
    """Merge the replies that arrived (None: failed or not supported).

    Counters are passed on exactly as read, absurd or not: judging a reset,
    a jump or a negative value is the core's business.  CRC errors prefer
    the driver's IEEE 802.3 FrameCheckSequenceErrors (ethtool eth-mac) and
    fall back to rtnetlink's rx_crc_errors, which every device reports but
    many software devices leave at 0.
    """
    fields: dict[str, Any] = {}
    if link is not None:
        fields.update(stats64_fields(link))
    if linkstate is not None:
        fields.update(linkstate_fields(linkstate))
    if fec is not None:
        fields.update(fec_fields(fec))
    if stats is not None:
        std = standard_stats(stats)
        symbol = std.get((ETHTOOL_STATS_ETH_PHY, ETHTOOL_A_STATS_ETH_PHY_5_SYM_ERR))
        fcs = std.get((ETHTOOL_STATS_ETH_MAC, ETHTOOL_A_STATS_ETH_MAC_6_FCS_ERR))
        if symbol is not None:
            fields["symbol_errors"] = symbol
        if fcs is not None:
            fields["rx_crc_errors"] = fcs
    return CounterSample(port=port, **fields)


# ----------------------------------------------------------------------
# the sensor
# ----------------------------------------------------------------------


class _Unsupported(Exception):
    """The kernel or driver does not offer this request for the port."""


class _ReadFailed(Exception):
    """Anything else: the reason is in the message."""


def _kernel_message(e: NetlinkError) -> str:
    message = e.args[1] if len(e.args) > 1 and e.args[1] else None
    # Linux's ENOTSUP is EOPNOTSUPP; say it the kernel's way.
    name = "EOPNOTSUPP" if e.code == _errno.EOPNOTSUPP else _errno.errorcode.get(e.code, "?")
    text = str(message) if message else os.strerror(e.code)
    return f"{text} ({name})"


def _reply_parser(sock, msg_class):
    """Parse this request's replies with ``msg_class``; acks and errors as the
    socket's marshal does."""
    marshal = sock.marshal
    prid = sock.prid

    def parse(data, offset, length):
        _, key, flags, seq = struct.unpack_from("IHHI", data, offset)
        if key != prid:
            return marshal.parse_one_message(key, flags, seq, data, offset, length)
        msg = msg_class(data, offset=offset)
        try:
            msg.decode()
        except NetlinkHeaderDecodeError as e:
            msg = genlmsg()
            msg["header"]["error"] = e
            return msg
        except NetlinkDecodeError as e:
            msg["header"]["error"] = e
            return msg
        msg["header"]["error"] = None
        return msg

    return parse


class EthtoolSensor:
    """Counters and module diagnostics for ports in one network namespace.

    ``netns`` None is the daemon's own namespace.  ``clock`` and ``sleep``
    exist so the rate limiter can be tested without waiting.  ``decoder``
    (default: linkpassd.adapters.optics) says which pages to read and turns
    them into an OpticsReading.
    Sockets are opened on first use, inside the running loop; ``close()``
    releases them.
    """

    def __init__(
        self,
        netns: str | None = None,
        *,
        min_module_interval_s: float = 1.0,
        request_timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        decoder: ModuleDecoder | None = None,
    ):
        self.netns = netns
        self.min_module_interval_s = min_module_interval_s
        self.request_timeout_s = request_timeout_s
        self.clock = clock
        self.sleep = sleep
        self._decoder: ModuleDecoder = decoder if decoder is not None else module_decoder
        self._genl: AsyncGenericNetlinkSocket | None = None
        self._genl_missing: str | None = None
        self._ipr: AsyncIPRoute | None = None
        self._open_lock = asyncio.Lock()
        self._port_locks: dict[str, asyncio.Lock] = {}
        self._last_module_read: dict[str, float] = {}
        self._cache: dict[tuple[str, Hashable], tuple[Any, float]] = {}
        self._warned: dict[tuple[str, str], str] = {}
        self.module_reads = 0  # requests that reached a module, for tests and metrics

    # -- sockets ---------------------------------------------------------

    def _ns_kwargs(self) -> dict[str, Any]:
        # flags=0: open an existing namespace, never create one.
        return {} if self.netns is None else {"netns": self.netns, "flags": 0}

    async def _genl_socket(self) -> AsyncGenericNetlinkSocket:
        async with self._open_lock:
            if self._genl_missing is not None:
                raise _Unsupported(self._genl_missing)
            if self._genl is None:
                sock = AsyncGenericNetlinkSocket(ext_ack=True, **self._ns_kwargs())
                try:
                    await sock.bind(ETHTOOL_GENL_NAME, genlmsg)
                except NetlinkError as e:
                    sock.close()
                    if e.code == _errno.ENOENT:  # kernel built without ETHTOOL_NETLINK
                        self._genl_missing = "no ethtool netlink family in this kernel"
                        raise _Unsupported(self._genl_missing) from e
                    raise
                except BaseException:
                    sock.close()
                    raise
                self._genl = sock
            return self._genl

    async def _rtnl_socket(self) -> AsyncIPRoute:
        async with self._open_lock:
            if self._ipr is None:
                self._ipr = AsyncIPRoute(**self._ns_kwargs())
            return self._ipr

    def _drop_genl(self) -> None:
        if self._genl is not None:
            self._genl.close()
            self._genl = None

    def close(self) -> None:
        for sock in (self._genl, self._ipr):
            if sock is not None:
                sock.close()
        self._genl = self._ipr = None

    async def __aenter__(self) -> "EthtoolSensor":
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()

    # -- one request -----------------------------------------------------

    async def _request(self, msg_class, cmd: int, port: str, flags: int = 0,
                       attrs: Sequence[tuple[str, Any]] = ()) -> list:
        """One ethtool GET; raises _Unsupported or _ReadFailed, nothing else."""
        try:
            sock = await self._genl_socket()
            msg = msg_class()
            msg["cmd"] = cmd
            msg["version"] = ETHTOOL_GENL_VERSION
            header = [("ETHTOOL_A_HEADER_DEV_NAME", port)]
            if flags:
                header.append(("ETHTOOL_A_HEADER_FLAGS", flags))
            msg["attrs"] = [(msg_class.header_attr, {"attrs": header}), *attrs]
            request = NetlinkRequest(
                sock, msg, msg_type=sock.prid, msg_flags=NLM_F_REQUEST | NLM_F_ACK,
                parser=_reply_parser(sock, msg_class),
            )
            async with asyncio.timeout(self.request_timeout_s):
                await request.send()
                return [m async for m in request.response() if m["header"]["type"] == sock.prid]
        except _Unsupported:
            raise
        except NetlinkError as e:
            if e.code in (_errno.EOPNOTSUPP, _errno.ENOTSUP):
                raise _Unsupported(_kernel_message(e)) from e
            raise _ReadFailed(_kernel_message(e)) from e
        except TimeoutError as e:
            self._drop_genl()  # a late answer must not meet the next request
            raise _ReadFailed(f"no answer in {self.request_timeout_s:g}s") from e
        except OSError as e:  # the socket itself (ENOBUFS, namespace gone): start afresh
            self._drop_genl()
            raise _ReadFailed(f"{type(e).__name__}: {e}") from e
        except Exception as e:  # undecodable replies: a sensor answer
            raise _ReadFailed(f"{type(e).__name__}: {e}") from e

    async def _link(self, port: str):
        try:
            ipr = await self._rtnl_socket()
            async with asyncio.timeout(self.request_timeout_s):
                reply = await ipr.link("get", ifname=port)
                # pyroute2 0.9 answers "get" with a list, "dump" with an iterator
                msgs = list(reply) if isinstance(reply, (list, tuple)) else [m async for m in reply]
        except NetlinkError as e:
            raise _ReadFailed(_kernel_message(e)) from e
        except (TimeoutError, OSError) as e:
            if self._ipr is not None:
                self._ipr.close()
                self._ipr = None
            reason = f"no answer in {self.request_timeout_s:g}s" if isinstance(e, TimeoutError) else str(e)
            raise _ReadFailed(reason) from e
        except Exception as e:  # undecodable replies: a sensor answer
            raise _ReadFailed(f"{type(e).__name__}: {e}") from e
        if not msgs:
            raise _ReadFailed("no RTM_NEWLINK in the reply")
        return msgs[0]

    def _note(self, port: str, what: str, reason: str | None) -> None:
        """Warn when a read starts failing or fails differently; quiet while
        it keeps failing the same way; forget once it works again."""
        key = (port, what)
        if reason is None:
            self._warned.pop(key, None)
        elif self._warned.get(key) != reason:
            self._warned[key] = reason
            log.warning("sensor_read_failed", port=port, request=what, reason=reason,
                        effect="fields left empty")

    async def _optional(self, port: str, what: str, read: Callable[[], Awaitable[T]]) -> T | None:
        try:
            result = await read()
        except _Unsupported:
            self._note(port, what, None)
            return None
        except _ReadFailed as e:
            self._note(port, what, str(e))
            return None
        self._note(port, what, None)
        return result

    # -- counters --------------------------------------------------------

    async def counters(self, port: str) -> CounterSample:
        """Error counters, FEC blocks, link-down count and extended link
        state.  Unsupported fields are None; nothing raises."""

        async def first(msg_class, cmd, flags=0, attrs=()):
            replies = await self._request(msg_class, cmd, port, flags, attrs)
            if not replies:
                raise _ReadFailed("empty reply")
            return replies[0]

        groups = (1 << ETHTOOL_STATS_ETH_PHY) | (1 << ETHTOOL_STATS_ETH_MAC)
        group_attrs = [("ETHTOOL_A_STATS_GROUPS", {"attrs": [
            ("ETHTOOL_A_BITSET_NOMASK", True),
            ("ETHTOOL_A_BITSET_SIZE", ETHTOOL_STATS_CNT),
            ("ETHTOOL_A_BITSET_VALUE", groups),
        ]})]
        # One after another: four sub-millisecond requests.  (Concurrent
        # counters() calls for other ports may share the sockets meanwhile:
        # replies are matched by sequence number.)
        link = await self._optional(port, "RTM_GETLINK", lambda: self._link(port))
        linkstate = await self._optional(
            port, "LINKSTATE_GET",
            lambda: first(linkstate_msg, ETHTOOL_MSG_LINKSTATE_GET, ETHTOOL_FLAG_STATS))
        stats = await self._optional(
            port, "STATS_GET",
            lambda: first(stats_msg, ETHTOOL_MSG_STATS_GET, 0, group_attrs))
        fec = await self._optional(
            port, "FEC_GET",
            lambda: first(fec_msg, ETHTOOL_MSG_FEC_GET,
                          ETHTOOL_FLAG_STATS | ETHTOOL_FLAG_COMPACT_BITSETS))
        return build_counter_sample(port, linkstate=linkstate, stats=stats, fec=fec, link=link)

    # -- module EEPROM ---------------------------------------------------

    def _lock(self, port: str) -> asyncio.Lock:
        return self._port_locks.setdefault(port, asyncio.Lock())

    async def _module_cached(self, port: str, key: Hashable,
                             read: Callable[[], Awaitable[T]]) -> Timed[T]:
        """One reader per module, reads of it at least
        ``min_module_interval_s`` apart.  The same question asked again
        inside the interval gets the cached answer; a different one waits
        for the interval to pass."""
        async with self._lock(port):
            now = self.clock()
            for k in [k for k, (_, at) in self._cache.items()
                      if k[0] == port and now - at >= self.min_module_interval_s]:
                del self._cache[k]
            hit = self._cache.get((port, key))
            if hit is not None:
                value, at = hit
                return Timed(value, at, now - at, cached=True)
            last = self._last_module_read.get(port)
            if last is not None:
                wait = last + self.min_module_interval_s - now
                if wait > 0:
                    await self.sleep(wait)
            try:
                value = await read()
            finally:
                self._last_module_read[port] = self.clock()
            at = self._last_module_read[port]
            self._cache[(port, key)] = (value, at)
            return Timed(value, at, 0.0, cached=False)

    async def _read_pages(self, port: str, refs: Sequence[PageRef]) -> dict[PageRef, bytes] | Unreadable:
        pages: dict[PageRef, bytes] = {}
        for ref in refs:
            problem = check_page_ref(ref)
            if problem is not None:
                return Unreadable(f"{port}: bad module page request: {problem}")
            length = _length(ref)
            attrs = [
                ("ETHTOOL_A_MODULE_EEPROM_OFFSET", int(ref.offset)),
                ("ETHTOOL_A_MODULE_EEPROM_LENGTH", length),
                ("ETHTOOL_A_MODULE_EEPROM_PAGE", int(ref.page)),
                ("ETHTOOL_A_MODULE_EEPROM_BANK", int(ref.bank)),
                ("ETHTOOL_A_MODULE_EEPROM_I2C_ADDRESS", int(ref.i2c)),
            ]
            self.module_reads += 1
            where = (f"page {ref.page:#04x} bank {ref.bank} offset {ref.offset} "
                     f"length {length} at i2c {ref.i2c:#04x}")
            try:
                replies = await self._request(
                    module_eeprom_msg, ETHTOOL_MSG_MODULE_EEPROM_GET, port, 0, attrs)
            except _Unsupported as e:
                return Unreadable(f"{port}: module EEPROM not supported: {e}")
            except _ReadFailed as e:
                return Unreadable(f"{port}: module EEPROM {where}: {e}")
            data = replies[0].get_attr("ETHTOOL_A_MODULE_EEPROM_DATA") if replies else None
            if not isinstance(data, (bytes, bytearray)):
                return Unreadable(f"{port}: module EEPROM {where}: reply without data")
            if len(data) != length:
                return Unreadable(f"{port}: module EEPROM {where}: "
                                  f"short read, {len(data)} of {length} bytes")
            pages[ref] = bytes(data)
        return pages

    async def module_pages_timed(self, port: str, refs: Iterable[PageRef]
                                 ) -> Timed[dict[PageRef, bytes] | Unreadable]:
        refs = tuple(refs)
        return await self._module_cached(port, ("pages", refs),
                                         lambda: self._read_pages(port, refs))

    async def module_pages(self, port: str, refs: Iterable[PageRef]
                           ) -> dict[PageRef, bytes] | Unreadable:
        """Raw MODULE_EEPROM_GET reads, all or nothing (rate-limited, cached)."""
        return (await self.module_pages_timed(port, refs)).value

    async def _read_optics(self, port: str) -> OpticsReading | Unreadable:
        decoder = self._decoder
        lower = await self._read_pages(port, [LOWER_PAGE0])
        if isinstance(lower, Unreadable):
            return lower
        page0 = lower[LOWER_PAGE0]
        try:
            spec = decoder.identify(page0)
            wanted = spec if isinstance(spec, Unreadable) else decoder.pages_needed(spec, page0)
            if not isinstance(wanted, Unreadable):
                wanted = [ref for ref in wanted if ref != LOWER_PAGE0]
        except Exception as e:  # noqa: BLE001 - a decoder bug must not end the daemon
            return Unreadable(f"{port}: module decoder failed: {type(e).__name__}: {e}")
        if isinstance(wanted, Unreadable):
            return Unreadable(f"{port}: {wanted.reason}")
        more = await self._read_pages(port, wanted)
        if isinstance(more, Unreadable):
            return more
        try:
            reading = decoder.decode({LOWER_PAGE0: page0, **more})
        except Exception as e:  # noqa: BLE001 - as above: a decoder bug must not end the daemon
            return Unreadable(f"{port}: module decoder failed: {type(e).__name__}: {e}")
        if isinstance(reading, Unreadable):
            return Unreadable(f"{port}: {reading.reason}")
        if not isinstance(reading, OpticsReading):
            return Unreadable(f"{port}: module decoder returned {type(reading).__name__}")
        return reading

    async def optics_timed(self, port: str) -> Timed[OpticsReading | Unreadable]:
        return await self._module_cached(port, ("optics",), lambda: self._read_optics(port))

    async def optics(self, port: str) -> OpticsReading | Unreadable:
        """Lower page 0, then the pages the decoder asks for, decoded; the
        whole read counts as one module access for the rate limiter."""
        return (await self.optics_timed(port)).value
