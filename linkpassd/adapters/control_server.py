"""The local control API: a grpc.aio server behind a credential proxy.

The server owns no state. Each call asks `status_provider` for a fresh
`DaemonStatus` snapshot and maps it to protobuf (adapters/control_convert.py),
so the daemon never has to push anything here and a slow client cannot hold
the daemon's state.  Streams (WatchEvents, WatchHealth) read the daemon's
feeds (adapters/feeds.py), where each reader keeps its own position: a slow
reader is told what it missed and never holds the daemon back.

Usage from the daemon (inside its running event loop):

    server = ControlServer(config.control_socket, daemon.status, daemon.explain,
                           events=feed, health=latest_health, drains=daemon,
                           group=config.control_group, admin_group=config.admin_group)
    await server.start()
    ...
    await server.stop(grace=1.0)

Who may do what (adapters/control_access.py): the public socket is mode 0660
with group `group` (root-only, 0600, with a warning when that group does not
exist); reading needs access to it.  Drain and Undrain need uid 0 or
membership of `admin_group`, decided from the caller's kernel credentials.

Without a provider (explain, events, health, drains) its RPCs answer
UNIMPLEMENTED.  The standard grpc.health.v1 service is registered too
(SERVING for "" and "linkpass.v1.ControlService" while running, NOT_SERVING
once stop() begins), and gRPC server reflection, so grpcurl needs no .proto.
"""

from __future__ import annotations

import asyncio
import errno
import math
import os
import socket
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Protocol, TypeVar

import grpc
import structlog
from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from linkpassd._proto.linkpass.v1 import control_pb2 as pb
from linkpassd._proto.linkpass.v1 import control_pb2_grpc as pb_grpc
from linkpassd.adapters.control_access import (
    GRPC_SOCKET_NAME,
    MAX_CONNECTIONS,
    AccessError,
    CredentialProxy,
    caller_from_peer,
    group_gid,
    prepare_private_dir,
    private_dir_for,
)
from linkpassd.adapters.control_convert import (
    drain_to_proto,
    event_to_proto,
    explanation_to_proto,
    fence_to_proto,
    health_to_proto,
    links_to_proto,
    port_state_to_proto,
    status_to_proto,
)
from linkpassd.adapters.feeds import EventFeed, Latest
from linkpassd.adapters.grpc_decode import add_servicer
from linkpassd.core.drain import DrainError, DrainNotTaken, DrainPending, NotDrained, UnknownPort
from linkpassd.core.explain import Explanation
from linkpassd.core.fence import FenceRequestError, FencingOff, NotAFencePort
from linkpassd.core.fence import View as FenceView
from linkpassd.core.healthdoc import HealthDoc
from linkpassd.core.model import DaemonStatus, DrainOutcome, FenceSettings, PortState

log = structlog.get_logger("linkpassd.control")

SOCKET_MODE = 0o660
ROOT_ONLY_SOCKET_MODE = 0o600
SOCKET_DIR_MODE = 0o755
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ControlService"].full_name

T = TypeVar("T")


class ControlSocketError(RuntimeError):
    """The control socket path cannot be (safely) bound."""


class DrainControl(Protocol):
    """What the daemon offers for Drain and Undrain.  `by` is the caller as
    the server identified it ("alice (uid 1000)").  Raise core.drain's
    UnknownPort or NotDrained (answered NOT_FOUND) or DrainError
    (INVALID_ARGUMENT), with a message that names the bad input."""

    async def drain(self, port: str, reason: str, duration_s: float | None,
                    by: str) -> DrainOutcome: ...

    async def undrain(self, port: str, by: str) -> PortState: ...


class FenceControl(Protocol):
    """What the daemon offers for ListFences and Unfence (daemon.fencing).
    `unfence` raises core.fence's NotAFencePort (NOT_FOUND), FencingOff
    (FAILED_PRECONDITION) or FenceRequestError (INVALID_ARGUMENT)."""

    def list_fences(self) -> tuple[FenceSettings, list[FenceView]]: ...

    async def unfence(self, port: str, hold_s: float | None, by: str) -> FenceView: ...


# --------------------------------------------------------------------------
# the server
# --------------------------------------------------------------------------


ExplainProvider = Callable[[str], Explanation | None]


class _ControlServicer(pb_grpc.ControlServiceServicer):
    def __init__(
        self,
        status_provider: Callable[[], DaemonStatus],
        explain_provider: ExplainProvider | None,
        wall_clock: Callable[[], float],
        *,
        events: EventFeed | None,
        health_doc: Latest[HealthDoc] | None,
        drains: DrainControl | None,
        fences: FenceControl | None = None,
        private_dir: Path,
        admin_group: str,
    ) -> None:
        self._status_provider = status_provider
        self._explain_provider = explain_provider
        self._wall_clock = wall_clock
        self._events = events
        self._health_doc = health_doc
        self._drains = drains
        self._fences = fences
        self._private_dir = private_dir
        self._admin_group = admin_group
        self.stopping = asyncio.Event()  # set by ControlServer.stop(): streams end cleanly

    async def _until_stopped(self, waiting: Awaitable[T]) -> tuple[bool, T | None]:
        """(True, result) of `waiting`, or (False, None) once the server stops."""
        task = asyncio.ensure_future(waiting)
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return True, task.result()
            return False, None
        finally:  # also when the client goes away (this coroutine is cancelled)
            task.cancel()
            stop.cancel()

    async def _snapshot(self, context: grpc.aio.ServicerContext) -> DaemonStatus:
        try:
            return self._status_provider()
        except Exception as exc:  # a provider bug must not look like a dead daemon
            log.exception("control_status_failed", error=str(exc))
            await context.abort(grpc.StatusCode.INTERNAL, f"status unavailable: {exc}")
            raise  # unreachable: abort raises

    async def GetStatus(self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext) -> pb.GetStatusResponse:
        status = await self._snapshot(context)
        return pb.GetStatusResponse(status=status_to_proto(status, served_at=self._wall_clock()))

    async def ListLinks(self, request: pb.ListLinksRequest, context: grpc.aio.ServicerContext) -> pb.ListLinksResponse:
        status = await self._snapshot(context)
        return links_to_proto(status, served_at=self._wall_clock())

    async def ExplainPort(self, request: pb.ExplainPortRequest,
                          context: grpc.aio.ServicerContext) -> pb.ExplainPortResponse:
        port = request.port
        if self._explain_provider is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this linkpassd serves no port explanations")
        if not port:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no port given")
        try:
            explanation = self._explain_provider(port)
        except Exception as exc:  # as in _snapshot: a provider bug is INTERNAL, not "unknown port"
            log.exception("control_explain_failed", port=port, error=str(exc))
            await context.abort(grpc.StatusCode.INTERNAL, f"explanation of {port!r} unavailable: {exc}")
            raise  # unreachable: abort raises
        if explanation is None:
            code, message = self._why_no_explanation(port)
            await context.abort(code, message)
        return explanation_to_proto(explanation, served_at=self._wall_clock())

    # -- events ------------------------------------------------------------

    async def _feed(self, context: grpc.aio.ServicerContext) -> EventFeed:
        if self._events is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this linkpassd keeps no events")
        assert self._events is not None
        return self._events

    async def _same_boot(self, context: grpc.aio.ServicerContext, feed: EventFeed, boot_id: str) -> None:
        """FAILED_PRECONDITION when the caller's sequence numbers belong to
        another boot (they restart at each boot, and the older boot's events
        are gone); an empty boot_id is not checked."""
        if boot_id and boot_id != feed.boot_id:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"boot_id {boot_id!r} is not this daemon's boot ({feed.boot_id!r}): linkpassd "
                                f"restarted and that boot's events are gone; start again with after_seq 0")

    async def ListEvents(self, request: pb.ListEventsRequest,
                         context: grpc.aio.ServicerContext) -> pb.ListEventsResponse:
        feed = await self._feed(context)
        await self._same_boot(context, feed, request.boot_id)
        events, missed = feed.log.after(request.after_seq, request.limit or None)
        return pb.ListEventsResponse(events=[event_to_proto(e) for e in events], missed=missed,
                                     boot_id=feed.boot_id, last_seq=feed.log.last_seq)

    async def WatchEvents(self, request: pb.WatchEventsRequest,
                          context: grpc.aio.ServicerContext) -> AsyncIterator[pb.WatchEventsResponse]:
        feed = await self._feed(context)
        await self._same_boot(context, feed, request.boot_id)
        seq = request.after_seq
        if seq > feed.log.last_seq:  # would wait, silently, for events this boot may never reach
            await context.abort(grpc.StatusCode.OUT_OF_RANGE,
                                f"after_seq {seq} is past this boot's newest event ({feed.log.last_seq}, "
                                f"boot {feed.boot_id}); a sequence number of an earlier boot?")
        while True:
            running, got = await self._until_stopped(feed.wait_after(seq))
            if not running or got is None:
                return
            events, missed = got
            for i, event in enumerate(events):
                yield pb.WatchEventsResponse(event=event_to_proto(event), missed=missed if i == 0 else 0)
            seq = events[-1].seq if events else seq + missed

    # -- drains ------------------------------------------------------------

    async def _admin_caller(self, context: grpc.aio.ServicerContext, action: str) -> str:
        """The caller's name for Drain.by; PERMISSION_DENIED saying the rule
        unless it is root or in admin_group (as the credential proxy saw it)."""
        caller = caller_from_peer(context.peer(), self._private_dir)
        who = "an unidentified caller" if caller is None else await asyncio.to_thread(caller.describe)
        if caller is not None and caller.admin:
            return who
        if self._admin_group:
            why = f"{action} needs root or membership of group {self._admin_group} (admin_group); you are {who}"
        else:
            why = f"admin_group is not set: only root may {action}; you are {who}"
        log.warning("control_refused", action=action, caller=who, peer=context.peer())
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
        raise AssertionError("unreachable: abort raises")

    async def _drain_call(self, context: grpc.aio.ServicerContext, port: str,
                          change: Callable[[], Awaitable[T]]) -> T:
        try:
            return await change()
        except (UnknownPort, NotDrained) as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except DrainPending as exc:  # recorded and kept; the routes have not moved yet
            await context.abort(grpc.StatusCode.ABORTED, str(exc))
        except DrainNotTaken as exc:  # the daemon is stopping, or its loop did not get to it
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except DrainError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception as exc:  # a provider bug is INTERNAL, not the caller's fault
            log.exception("control_drain_failed", port=port, error=str(exc))
            await context.abort(grpc.StatusCode.INTERNAL, f"drain change of {port!r} failed: {exc}")
        raise AssertionError("unreachable: abort raises")

    async def _drain_request(self, context: grpc.aio.ServicerContext, action: str,
                             port: str) -> tuple[DrainControl, str]:
        """What Drain and Undrain check first: a provider, an admin caller, a port."""
        drains = self._drains
        if drains is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this linkpassd takes no drains")
        by = await self._admin_caller(context, action)
        if not port:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no port given")
        assert drains is not None
        return drains, by

    # The daemon records each drain and undrain as an event (with who and
    # why), which is its log line: nothing more is logged here.
    async def Drain(self, request: pb.DrainRequest, context: grpc.aio.ServicerContext) -> pb.DrainResponse:
        drains, by = await self._drain_request(context, "drain", request.port)
        d = request.duration_s
        if not math.isfinite(d) or d < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"duration_s must be 0 (until undrained) or more, not {d!r}")
        outcome = await self._drain_call(context, request.port, lambda: drains.drain(
            request.port, request.reason, d or None, by))
        return pb.DrainResponse(
            state=port_state_to_proto(outcome.state), notes=list(outcome.notes),
            replaced=None if outcome.replaced is None else drain_to_proto(outcome.replaced))

    async def Undrain(self, request: pb.UndrainRequest, context: grpc.aio.ServicerContext) -> pb.UndrainResponse:
        drains, by = await self._drain_request(context, "undrain", request.port)
        state = await self._drain_call(context, request.port, lambda: drains.undrain(request.port, by))
        return pb.UndrainResponse(state=port_state_to_proto(state))

    # -- fences ------------------------------------------------------------

    async def ListFences(self, request: pb.ListFencesRequest,
                         context: grpc.aio.ServicerContext) -> pb.ListFencesResponse:
        if self._fences is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this linkpassd has no fences")
        assert self._fences is not None
        settings, views = self._fences.list_fences()
        return pb.ListFencesResponse(enabled=settings.enabled, fences=[fence_to_proto(v) for v in views],
                                     require_leaf_grant=settings.require_leaf_grant,
                                     max_fenced=settings.max_fenced)

    async def Unfence(self, request: pb.UnfenceRequest,
                      context: grpc.aio.ServicerContext) -> pb.UnfenceResponse:
        fences = self._fences
        if fences is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this linkpassd has no fences")
        assert fences is not None
        by = await self._admin_caller(context, "unfence")
        if not request.port:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no port given")
        hold = request.hold_s
        if not math.isfinite(hold) or hold < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"hold_s must be 0 (the config's lift_hold_s) or more, not {hold!r}")
        try:
            view = await fences.unfence(request.port, hold or None, by)
        except NotAFencePort as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except FencingOff as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except FenceRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pb.UnfenceResponse(fence=fence_to_proto(view))

    # -- health ------------------------------------------------------------

    async def WatchHealth(self, request: pb.WatchHealthRequest,
                          context: grpc.aio.ServicerContext) -> AsyncIterator[pb.WatchHealthResponse]:
        latest = self._health_doc
        if latest is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this linkpassd publishes no health document")
        assert latest is not None
        generation = 0  # so the current document goes out at once
        while True:
            running, got = await self._until_stopped(latest.wait_newer(generation))
            if not running or got is None:
                return
            generation, doc = got
            yield health_to_proto(doc)

    def _why_no_explanation(self, port: str) -> tuple[grpc.StatusCode, str]:
        """NOT_FOUND naming the rail ports, unless `port` is one of them (then
        the daemon has not judged it yet)."""
        try:
            rails = self._status_provider().rails
        except Exception as exc:  # noqa: BLE001 - the answer is still NOT_FOUND, just without the list
            log.warning("control_status_failed", error=str(exc))
            return grpc.StatusCode.NOT_FOUND, f"unknown port {port!r}"
        configured = list(dict.fromkeys(r.port for r in rails))
        if port in configured:
            return (grpc.StatusCode.FAILED_PRECONDITION,
                    f"port {port!r} has not been judged yet; try again in a moment")
        if not configured:
            return grpc.StatusCode.NOT_FOUND, f"unknown port {port!r}; linkpassd reports no rails yet"
        return grpc.StatusCode.NOT_FOUND, f"unknown port {port!r}; configured rail ports: {', '.join(configured)}"


class ControlServer:
    """gRPC control API on a Unix socket, behind the credential proxy.

    The providers' times must be unix seconds, PortState.since included (the
    proto says so; the daemon converts from its monotonic clock).
    `explain_provider(port)` returns None for a port that is not a configured
    rail's port.  `events`, `health` and `drains` serve the RPCs of their
    names; without one, those answer UNIMPLEMENTED.  `wall_clock` stamps each
    answer's `served_at`; tests inject a fixed one.

    gRPC itself listens on `<private_dir>/grpc.sock`; `private_dir` (0700,
    next to the socket) is named after the public socket, e.g.
    /run/linkpass/linkpassd.private for /run/linkpass/linkpassd.sock (a
    temporary directory instead when that path is too long for the callers'
    socket names: see control_access.private_dir_for).
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        status_provider: Callable[[], DaemonStatus],
        explain_provider: ExplainProvider | None = None,
        *,
        events: EventFeed | None = None,
        health: Latest[HealthDoc] | None = None,
        drains: DrainControl | None = None,
        fences: FenceControl | None = None,
        group: str = "linkpass",
        admin_group: str = "",
        wall_clock: Callable[[], float] = time.time,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.socket_path = Path(socket_path).absolute()
        self.private_dir = private_dir_for(self.socket_path)
        self.group = group
        self.admin_group = admin_group
        self._max_connections = max_connections
        self._servicer = _ControlServicer(status_provider, explain_provider, wall_clock, events=events,
                                          health_doc=health, drains=drains, fences=fences,
                                          private_dir=self.private_dir,
                                          admin_group=admin_group)
        self._server: grpc.aio.Server | None = None
        self._proxy: CredentialProxy | None = None
        self._health: grpc_health.aio.HealthServicer | None = None
        self._socket_inode: tuple[int, int] | None = None

    @property
    def grpc_socket(self) -> Path:
        return self.private_dir / GRPC_SOCKET_NAME

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("control server already started")
        _prepare_socket_path(self.socket_path)
        try:
            prepare_private_dir(self.private_dir)
        except (AccessError, OSError) as exc:
            raise ControlSocketError(str(exc)) from exc
        # NSS may be slow (LDAP): resolve the groups once, off the loop.
        control_gid = await asyncio.to_thread(group_gid, self.group)
        admin_gid = await asyncio.to_thread(group_gid, self.admin_group)
        if self.admin_group and admin_gid is None:
            log.warning("control_admin_group_missing", group=self.admin_group,
                        consequence="only root may drain or undrain")
        server = grpc.aio.server()
        add_servicer(pb_grpc.add_ControlServiceServicer_to_server, self._servicer, server)
        self._health = grpc_health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server)
        await self._health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        public: socket.socket | None = None
        try:
            # add_insecure_port raises RuntimeError when binding fails.
            server.add_insecure_port(f"unix:{self.grpc_socket}")
            await server.start()
            public = _bind_public_socket(self.socket_path, self.group, control_gid)
            st = os.stat(self.socket_path)
            proxy = CredentialProxy(public, self.private_dir, self.grpc_socket, admin_gid,
                                    max_connections=self._max_connections)
            await proxy.start()
        except BaseException:
            if public is not None:
                public.close()
            await server.stop(None)
            raise
        self._socket_inode = (st.st_dev, st.st_ino)
        self._server = server
        self._proxy = proxy

    async def stop(self, grace: float | None = 1.0) -> None:
        """End the streams, answer in-flight calls for up to `grace` seconds,
        then close and remove our socket file (only if it is still the one
        we bound)."""
        server, self._server = self._server, None
        proxy, self._proxy = self._proxy, None
        if server is None:
            return
        self._servicer.stopping.set()
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if proxy is not None:
            proxy.stop_accepting()
        await server.stop(grace)
        if proxy is not None:
            await proxy.close()
        try:
            st = os.stat(self.socket_path)
            if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == self._socket_inode:
                os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        for leftover in (self.grpc_socket, self.private_dir):
            try:
                leftover.rmdir() if leftover.is_dir() else leftover.unlink()
            except OSError:
                pass  # gone already, or not empty: harmless, cleared at the next start

    async def wait_for_termination(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()


def _bind_public_socket(path: Path, group: str, gid: int | None) -> socket.socket:
    """The socket callers connect to: bound, given its group and mode, and
    only then listening (connect(2) is refused until listen(), so nobody gets
    in through the umask's permissions meanwhile)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        if gid is not None:
            try:
                os.chown(path, -1, gid)
            except PermissionError as exc:
                sock.close()
                # Without CAP_CHOWN the owner may only give its file to a
                # group it is a member of (the unit's SupplementaryGroups=).
                raise ControlSocketError(
                    f"cannot give {path} to group {group!r}: {exc.strerror}; linkpassd must be a "
                    f"member of {group!r} (SupplementaryGroups={group} in its systemd unit)") from exc
            os.chmod(path, SOCKET_MODE)
        else:
            os.chmod(path, ROOT_ONLY_SOCKET_MODE)
            log.warning("control_group_missing", group=group or "(none)", socket=str(path),
                        consequence="only root can use linkpassctl; create the group and restart")
        sock.listen(128)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise ControlSocketError(f"cannot bind {path}: {exc.strerror or exc}") from exc
    return sock


def _prepare_socket_path(path: Path) -> None:
    """Create the parent dir (0755) and clear a stale socket.

    Refuses to remove anything that is not a socket, or a socket that another
    process still answers on (a second daemon must not steal the first one's
    socket).
    """
    parent = path.parent
    try:
        if not parent.exists():
            parent.mkdir(parents=True, exist_ok=True)
            os.chmod(parent, SOCKET_DIR_MODE)  # mkdir's mode is subject to umask
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:  # a parent that is a regular file, no permission: said, not a traceback
        raise ControlSocketError(f"cannot make the control socket {path}: {exc.strerror or exc}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise ControlSocketError(f"{path} exists and is not a socket; not removing it")
    if _socket_is_live(path):
        raise ControlSocketError(f"{path} is in use by another process (is linkpassd already running?)")
    os.unlink(path)


def _socket_is_live(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            return False
        raise ControlSocketError(f"cannot probe {path}: {exc.strerror}") from exc
    finally:
        probe.close()
    return True
