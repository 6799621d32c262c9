"""Who is calling the control API: a credential proxy in front of gRPC.

grpc python cannot tell a Unix-socket caller's uid (its `auth_context` is
empty for insecure ports and it exposes no socket).  So the daemon serves gRPC
only on a private socket inside a 0700 directory nobody else can enter, and
listens itself on the public control socket.  For each connection it reads
the caller's credentials from the kernel (SO_PEERCRED, and SO_PEERGROUPS for
the supplementary groups), decides read or admin, and connects upstream from
a client socket *bound to a path that encodes the decision*, e.g.
`<private>/c7-u1000-p4242-read`.  gRPC's `context.peer()` then reads
`unix:<private>/c7-u1000-p4242-read`, which `caller_from_peer` parses.  Only
this proxy can create names in the private directory, so a caller cannot
forge one; anything that does not parse is treated as read-only.

The kernel takes the credentials at connect(2) time, and gRPC keeps one
connection per channel, so the decision per connection is the decision per
call.  The proxy is bounded, and a read-only user cannot lock the admins
out: the credentials are read first, then a connection is refused (closed at
once, logged at most every few seconds) when it would exceed
`max_connections` in all, `max_per_reader` from one non-admin uid, or
`max_connections - admin_reserved` non-admin connections in all (the rest are
kept for root and admin_group).  Both sides close when either ends, and no
step blocks the event loop (group names are resolved once at start, in a
thread).  There is no idle timeout: `events --follow` is idle by design.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import grp
import os
import pwd
import re
import socket
import stat
import struct
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger("linkpassd.control")

MAX_CONNECTIONS = 64
MAX_PER_READER_UID = 8  # concurrent connections of one non-admin uid
ADMIN_RESERVED = 8  # of MAX_CONNECTIONS, only root and admin_group may use these
REFUSAL_LOG_INTERVAL_S = 10.0  # at most one refusal log line per reason this often
CONNECT_TIMEOUT_S = 5.0
PUMP_CHUNK = 64 * 1024
PRIVATE_DIR_MODE = 0o700
GRPC_SOCKET_NAME = "grpc.sock"
# Linux >= 4.13; the socket module does not export it on every build.
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)
_GID_SIZE = struct.calcsize("I")
# socket.getsockopt refuses a buflen over 1024 bytes, so at most 256 gids.
_PEERGROUPS_MAX_GIDS = 1024 // _GID_SIZE

_CALLER_NAME = re.compile(r"c(\d+)-u(\d+)-p(\d+)-(read|admin)")
# The longest name the proxy binds (uid and pid at their widest).
_LONGEST_CALLER_NAME = "c9999999999-u4294967295-p4194304-admin"
_SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes, with the NUL


class AccessError(RuntimeError):
    """The private directory or its sockets cannot be set up safely."""


@dataclass(frozen=True)
class Caller:
    """A control API caller as the kernel saw it at connect time."""

    uid: int
    pid: int
    admin: bool

    def describe(self) -> str:
        """'alice (uid 1000)'; 'uid 1000' when the uid has no name.  Looks
        the name up (NSS), so call it off the event loop."""
        try:
            return f"{pwd.getpwuid(self.uid).pw_name} (uid {self.uid})"
        except (KeyError, OverflowError):
            return f"uid {self.uid}"


def caller_name(n: int, uid: int, pid: int, admin: bool) -> str:
    return f"c{n}-u{uid}-p{pid}-{'admin' if admin else 'read'}"


def caller_from_peer(peer: str, private_dir: Path) -> Caller | None:
    """The caller named by gRPC's `context.peer()`, or None when the peer is
    not a name this proxy binds in `private_dir` (then: read-only, unknown)."""
    prefix = f"unix:{private_dir}/"
    if not peer.startswith(prefix):
        return None
    m = _CALLER_NAME.fullmatch(peer[len(prefix):])
    if m is None:
        return None
    return Caller(uid=int(m.group(2)), pid=int(m.group(3)), admin=m.group(4) == "admin")


@dataclass(frozen=True)
class PeerCredentials:
    pid: int
    uid: int
    gids: frozenset[int]  # primary and supplementary


def peer_credentials(sock: socket.socket) -> PeerCredentials:
    """SO_PEERCRED, plus the supplementary groups (SO_PEERGROUPS, or
    /proc/<pid>/status on kernels without it).  Raises OSError."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return PeerCredentials(pid=pid, uid=uid, gids=frozenset({gid, *_supplementary_groups(sock, pid)}))


def _supplementary_groups(sock: socket.socket, pid: int) -> tuple[int, ...]:
    """SO_PEERGROUPS into the largest buffer Python's getsockopt accepts
    (1024 bytes: 256 groups; a larger buflen is refused with an OSError that
    carries no errno).  A caller with more groups (ERANGE), or a kernel
    without SO_PEERGROUPS, is read from /proc/<pid>/status instead."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, _PEERGROUPS_MAX_GIDS * _GID_SIZE)
    except OSError as exc:
        if exc.errno in (errno.ERANGE, errno.ENOPROTOOPT, errno.EINVAL):
            return _proc_groups(pid)
        raise
    return struct.unpack(f"{len(raw) // _GID_SIZE}I", raw[: len(raw) // _GID_SIZE * _GID_SIZE])


def _proc_groups(pid: int) -> tuple[int, ...]:
    """The `Groups:` line of /proc/<pid>/status; () when it cannot be read
    (the caller is then judged on its uid and primary group only)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return tuple(int(g) for g in line.split()[1:] if g.isdigit())
    except OSError:
        pass
    return ()


def group_gid(name: str) -> int | None:
    """The gid of group `name`; None when it is unset or does not exist."""
    if not name:
        return None
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def private_dir_for(socket_path: Path) -> Path:
    """Where the private gRPC socket and the callers' names live:
    `<socket stem>.private` next to the public socket (e.g.
    /run/linkpass/linkpassd.private), or, when a caller's name would not fit
    in a Unix socket path there, a fresh 0700 directory under the system's
    temporary directory (any control_socket the config accepts still works)."""
    beside = socket_path.with_name(socket_path.stem + ".private")
    if len(str(beside / _LONGEST_CALLER_NAME)) <= _SUN_PATH_MAX:
        return beside
    return Path(tempfile.mkdtemp(prefix="linkpassd-ctl-"))


def prepare_private_dir(path: Path) -> None:
    """Create (0700) or reuse our private directory, refusing anything that is
    not a real directory owned by us, and clear what a previous run left in it
    (the caller only gets here once the public socket is known to be dead)."""
    try:
        path.mkdir(mode=PRIVATE_DIR_MODE)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise AccessError(f"{path} exists but is not a directory owned by uid {os.geteuid()}; not using it")
    os.chmod(path, PRIVATE_DIR_MODE)
    for entry in path.iterdir():
        if entry.name == GRPC_SOCKET_NAME or _CALLER_NAME.fullmatch(entry.name):
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(os.lstat(entry).st_mode):
                    entry.unlink()
    longest = len(str(path / _LONGEST_CALLER_NAME))
    if longest > _SUN_PATH_MAX:
        raise AccessError(f"{path} is too long for Unix socket names inside it "
                          f"({longest} > {_SUN_PATH_MAX} bytes); use a shorter control_socket path")


class CredentialProxy:
    """The public control socket: reads each caller's credentials and relays
    its bytes to the private gRPC socket from a name that says who it is."""

    def __init__(self, public_sock: socket.socket, private_dir: Path, upstream: Path,
                 admin_gid: int | None, *, max_connections: int = MAX_CONNECTIONS,
                 max_per_reader: int = MAX_PER_READER_UID, admin_reserved: int = ADMIN_RESERVED) -> None:
        self._public_sock = public_sock  # bound and listening, mode and group already set
        self.private_dir = private_dir
        self._upstream = upstream
        self._admin_gid = admin_gid
        self._max = max_connections
        self._max_per_reader = max_per_reader
        self._max_readers = max(0, max_connections - admin_reserved)
        self._server: asyncio.base_events.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._reader_uids: Counter[int] = Counter()  # open non-admin connections per uid
        self._counter = 0
        self.refused = 0  # connections refused since start (tests, diagnostics)
        self._refusal_log = _RateLimitedLog(REFUSAL_LOG_INTERVAL_S)

    @property
    def active(self) -> int:
        return len(self._handlers)

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._accept, sock=self._public_sock)

    def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        """Stop accepting and cut every relayed connection."""
        self.stop_accepting()
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    @property
    def readers(self) -> int:
        """Open connections of non-admin callers."""
        return sum(self._reader_uids.values())

    def _why_refused(self, uid: int, admin: bool) -> tuple[str, int] | None:
        """(reason, limit) when one more connection of this caller would pass
        a limit; None when it may have one."""
        if len(self._handlers) >= self._max:
            return "too many connections", self._max
        if admin:
            return None
        if self.readers >= self._max_readers:
            return "too many read-only connections (the rest are kept for admins)", self._max_readers
        if self._reader_uids[uid] >= self._max_per_reader:
            return "too many connections from this uid", self._max_per_reader
        return None

    def _refuse(self, writer: asyncio.StreamWriter, reason: str, **fields: object) -> None:
        self.refused += 1
        writer.close()
        suppressed = self._refusal_log.allow(reason, time.monotonic())
        if suppressed is not None:
            log.warning("control_connection_refused", reason=reason, **fields,
                        refused_unlogged_since_last=suppressed)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:  # first: the limits depend on who is calling
            creds = peer_credentials(writer.get_extra_info("socket"))
        except OSError as exc:
            self._refuse(writer, "caller's credentials unreadable", error=str(exc))
            return
        admin = creds.uid == 0 or (self._admin_gid is not None and self._admin_gid in creds.gids)
        refusal = self._why_refused(creds.uid, admin)
        if refusal is not None:
            self._refuse(writer, refusal[0], limit=refusal[1], uid=creds.uid, pid=creds.pid)
            return
        self._handlers.add(task)
        if not admin:
            self._reader_uids[creds.uid] += 1
        try:
            await self._relay(reader, writer, creds, admin)
        except asyncio.CancelledError:
            pass  # close(): the server is stopping
        except Exception as exc:  # noqa: BLE001 - one bad connection must not reach the loop's handler
            log.warning("control_connection_failed", error=str(exc))
        finally:
            self._handlers.discard(task)
            if not admin:
                self._reader_uids[creds.uid] -= 1
                if self._reader_uids[creds.uid] <= 0:
                    del self._reader_uids[creds.uid]
            writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     creds: PeerCredentials, admin: bool) -> None:
        self._counter += 1
        up_writer = None
        upstream = await self._connect_as(caller_name(self._counter, creds.uid, creds.pid, admin))
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(sock=upstream)
            upstream = None  # the transport owns it now
            pumps = [asyncio.ensure_future(_pump(reader, up_writer)),
                     asyncio.ensure_future(_pump(up_reader, writer))]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            if upstream is not None:
                upstream.close()
            if up_writer is not None:
                up_writer.close()

    async def _connect_as(self, name: str) -> socket.socket:
        """A connection to the gRPC socket from `<private>/<name>`; the name
        is unlinked once connected (the kernel keeps it as the peer address)."""
        path = self.private_dir / name
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.bind(str(path))
            try:
                await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, str(self._upstream)),
                                       CONNECT_TIMEOUT_S)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        except BaseException:
            sock.close()
            raise
        return sock


class _RateLimitedLog:
    """At most one log line per key every `interval_s`: a caller hammering the
    socket must not flood the journal with refusals."""

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._last: dict[str, float] = {}
        self._unlogged: Counter[str] = Counter()

    def allow(self, key: str, now: float) -> int | None:
        """How many were left unlogged since the last line, when this one
        may be logged; None when it should not be."""
        last = self._last.get(key)
        if last is not None and now - last < self._interval_s:
            self._unlogged[key] += 1
            return None
        self._last[key] = now
        return self._unlogged.pop(key, 0)


async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """Copy until EOF or an error; drain() keeps a slow side from filling memory."""
    with contextlib.suppress(ConnectionError, OSError):
        while data := await src.read(PUMP_CHUNK):
            dst.write(data)
            await dst.drain()
