"""sendmmsg(2) and recvmmsg(2) for IPv4 UDP sockets, through ctypes on libc.

Why: at fleet scale the echo prober sends and receives thousands of 40-byte
datagrams a second, and one Python call plus one system call per datagram
was a large share of its cost (issue 11). The standard library has no
batched calls, so this module adds the small piece: preallocated arrays of
`struct mmsghdr`, each with one payload slot, one sockaddr_in and (for
receiving) one control slot, handed to the kernel in one call. The caller
writes and reads the slots in place (struct.pack_into / unpack_from on the
buffers), so nothing is allocated per datagram.

Linux only (sendmmsg since 3.0, recvmmsg since 2.6.33). The structures'
layout is taken from ctypes' own computation of the C layout on this
platform, not written out by hand.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import os
import socket
import struct

__all__ = ["RecvBatch", "SendBatch", "available"]

_MSG_DONTWAIT = 0x40
_AF_INET = socket.AF_INET


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [("msg_name", ctypes.c_void_p), ("msg_namelen", ctypes.c_uint32),
                ("msg_iov", ctypes.c_void_p), ("msg_iovlen", ctypes.c_size_t),
                ("msg_control", ctypes.c_void_p), ("msg_controllen", ctypes.c_size_t),
                ("msg_flags", ctypes.c_int)]


class _MMsgHdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _MsgHdr), ("msg_len", ctypes.c_uint)]


_HDR = ctypes.sizeof(_MMsgHdr)
_IOV = ctypes.sizeof(_IoVec)
_NAME = 16  # sizeof(struct sockaddr_in)
_OFF_CONTROLLEN = _MsgHdr.msg_controllen.offset
_OFF_FLAGS = _MsgHdr.msg_flags.offset
_OFF_LEN = _MMsgHdr.msg_len.offset
# What the kernel writes back per message, read in one call from msg_controllen
# on: (msg_controllen, msg_flags, msg_len).
assert _OFF_CONTROLLEN < _OFF_FLAGS < _OFF_LEN
RESULT = struct.Struct("@N" + "x" * (_OFF_FLAGS - _OFF_CONTROLLEN - ctypes.sizeof(ctypes.c_size_t))
                       + "i" + "x" * (_OFF_LEN - _OFF_FLAGS - 4) + "I")
RESULT_OFFSET = _OFF_CONTROLLEN
_SOCKADDR_IN = struct.Struct("@H")  # sin_family, native order; port and address follow in network order
_IP_PKTINFO = 8
_CMSGHDR = struct.Struct("@Nii")  # cmsg_len, cmsg_level, cmsg_type (then the data, aligned)
_PKTINFO_BODY = struct.Struct("@i4s")  # ipi_ifindex, ipi_spec_dst (ipi_addr is ignored on send)
_PKTINFO_LEN = socket.CMSG_LEN(12)  # struct in_pktinfo
_PKTINFO_SPACE = socket.CMSG_SPACE(12)
_PORT_ADDR = struct.Struct("!H4s")

try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _sendmmsg = _libc.sendmmsg
    _recvmmsg = _libc.recvmmsg
    _sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
    _sendmmsg.restype = ctypes.c_int
    _recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int,
                          ctypes.c_void_p]
    _recvmmsg.restype = ctypes.c_int
    _AVAILABLE = True
except (OSError, AttributeError):  # not glibc/musl on Linux
    _AVAILABLE = False


def available() -> bool:
    """Whether this platform's libc has sendmmsg and recvmmsg."""
    return _AVAILABLE


class _Batch:
    """`capacity` messages, each with one payload slot of `slot` bytes, a
    sockaddr_in and `control` bytes of ancillary data (0: none)."""

    def __init__(self, capacity: int, slot: int, control: int = 0):
        if not _AVAILABLE:
            raise OSError(_errno.ENOSYS, "sendmmsg/recvmmsg are not available from libc")
        if capacity < 1 or slot < 1 or control < 0:
            raise ValueError(f"need capacity >= 1, slot >= 1, control >= 0; got "
                             f"{capacity}, {slot}, {control}")
        self.capacity, self.slot, self.control_slot = capacity, slot, control
        self.headers = bytearray(capacity * _HDR)
        self.payload = bytearray(capacity * slot)
        self.names = bytearray(capacity * _NAME)
        self.control = bytearray(max(1, capacity * control))
        self._iovs = bytearray(capacity * _IOV)
        # ctypes views over the bytearrays: their addresses are what the kernel
        # gets; the bytearrays are never resized, so the addresses stay valid.
        self._c_headers = (ctypes.c_char * len(self.headers)).from_buffer(self.headers)
        c_payload = (ctypes.c_char * len(self.payload)).from_buffer(self.payload)
        c_names = (ctypes.c_char * len(self.names)).from_buffer(self.names)
        c_control = (ctypes.c_char * len(self.control)).from_buffer(self.control)
        c_iovs = (ctypes.c_char * len(self._iovs)).from_buffer(self._iovs)
        self._base = ctypes.addressof(self._c_headers)
        self._keep = (c_payload, c_names, c_control, c_iovs)
        iovs = (_IoVec * capacity).from_buffer(self._iovs)
        hdrs = (_MMsgHdr * capacity).from_buffer(self.headers)
        for i in range(capacity):
            iovs[i].iov_base = ctypes.addressof(c_payload) + i * slot
            iovs[i].iov_len = slot
            h = hdrs[i].msg_hdr
            h.msg_name = ctypes.addressof(c_names) + i * _NAME
            h.msg_namelen = _NAME
            h.msg_iov = ctypes.addressof(c_iovs) + i * _IOV
            h.msg_iovlen = 1
            if control:
                h.msg_control = ctypes.addressof(c_control) + i * control
                h.msg_controllen = control
            _SOCKADDR_IN.pack_into(self.names, i * _NAME, _AF_INET)
        del iovs, hdrs  # only needed to fill the headers in; the buffers stay pinned by _keep
        self._pristine = bytes(self.headers)  # what each receive restores

    def _at(self, index: int) -> int:
        return self._base + index * _HDR


class SendBatch(_Batch):
    """Datagrams of `size` bytes each, queued with `add` and sent in one
    sendmmsg by `send`:

        i = batch.add(addr4, port)           # then write its payload in place:
        PACKET.pack_into(batch.payload, i * batch.slot, ...)
        failures = batch.send(fd)             # [(index, errno)]; the batch is empty again

    `pktinfo`: each datagram carries an IP_PKTINFO message (`add`'s ifindex
    and local address: which interface and source address it leaves by).
    """

    def __init__(self, capacity: int = 64, size: int = 40, pktinfo: bool = False):
        super().__init__(capacity, size, _PKTINFO_SPACE if pktinfo else 0)
        self.count = 0
        self.pktinfo = pktinfo
        if pktinfo:
            for i in range(capacity):
                _CMSGHDR.pack_into(self.control, i * _PKTINFO_SPACE, _PKTINFO_LEN,
                                   socket.IPPROTO_IP, _IP_PKTINFO)

    def __len__(self) -> int:
        return self.count

    @property
    def full(self) -> bool:
        return self.count >= self.capacity

    def add(self, addr4: bytes, port: int, ifindex: int = 0, local4: bytes = bytes(4)) -> int:
        """Queue a datagram to (`addr4`, a packed IPv4 address, `port`) and
        return its slot index (with `pktinfo`: out of interface `ifindex`,
        from `local4`; 0 and 0.0.0.0: as routed). Raises IndexError when full."""
        i = self.count
        if i >= self.capacity:
            raise IndexError("send batch is full")
        _PORT_ADDR.pack_into(self.names, i * _NAME + 2, port, addr4)
        if self.pktinfo:
            _PKTINFO_BODY.pack_into(self.control, i * _PKTINFO_SPACE + _CMSGHDR.size, ifindex,
                                    local4)
        self.count = i + 1
        return i

    def clear(self) -> None:
        self.count = 0

    def send(self, fd: int) -> list[tuple[int, int]]:
        """Send every queued datagram (the batch is empty afterwards). Returns
        the ones the kernel refused, as (index, errno): the rest were sent.
        A call interrupted by a signal is retried; a would-block (a full
        socket buffer) fails the datagrams not yet sent; any other error
        fails the one datagram it names, and the rest are sent."""
        failed: list[tuple[int, int]] = []
        start, count = 0, self.count
        self.count = 0
        while start < count:
            n = _sendmmsg(fd, self._at(start), count - start, _MSG_DONTWAIT)
            if n > 0:
                start += n
                continue
            err = ctypes.get_errno() if n < 0 else _errno.EIO
            if err == _errno.EINTR:
                continue
            if err in (_errno.EAGAIN, _errno.ENOBUFS):
                failed.extend((i, err) for i in range(start, count))
                break
            failed.append((start, err))
            start += 1
        return failed


class RecvBatch(_Batch):
    """Up to `capacity` datagrams per recvmmsg call, read in place.

        n = batch.recv(fd)                  # 0: nothing waiting
        for i in range(n):
            flags, length = batch.result(i)
            port, addr4 = batch.source(i)
            data at batch.payload[i * batch.slot:][:length], ancillary data at
            batch.control[i * batch.control_slot:]
    """

    def __init__(self, capacity: int = 64, slot: int = 64, control: int = 64):
        super().__init__(capacity, slot, control)
        self._used = 0  # messages the last call filled (their headers need restoring)

    def recv(self, fd: int) -> int:
        """Receive what is waiting, up to `capacity` datagrams, without
        blocking. Returns how many (0 when none). Raises OSError for an error
        the socket reports (e.g. ECONNREFUSED from a pending ICMP error)."""
        used = self._used
        if used:  # the kernel rewrote msg_namelen, msg_controllen, msg_flags, msg_len
            end = used * _HDR
            self.headers[:end] = self._pristine[:end]
        while True:
            n = _recvmmsg(fd, self._base, self.capacity, _MSG_DONTWAIT, None)
            if n >= 0:
                self._used = n
                return n
            err = ctypes.get_errno()
            if err == _errno.EINTR:
                continue
            self._used = 0
            if err in (_errno.EAGAIN, _errno.EWOULDBLOCK):
                return 0
            raise OSError(err, os.strerror(err))

    def result(self, i: int) -> tuple[int, int, int]:
        """(ancillary bytes, msg_flags, length) of message `i` of the last receive."""
        return RESULT.unpack_from(self.headers, i * _HDR + _OFF_CONTROLLEN)

    def source(self, i: int) -> tuple[int, bytes]:
        """(port, packed IPv4 address) message `i` came from."""
        return PORT_ADDR.unpack_from(self.names, i * _NAME + 2)


# For callers that read the buffers in their own loop (the hot path): message
# i's result is RESULT at headers[i * HEADER_SIZE + RESULT_OFFSET], its source
# PORT_ADDR at names[i * NAME_SIZE + 2].
HEADER_SIZE = _HDR
NAME_SIZE = _NAME
PORT_ADDR = _PORT_ADDR
