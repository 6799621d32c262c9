"""adapters.control_access without a server: reading a caller's groups, and
the refusal log's rate limit (the proxy's limits themselves are tested
through a running server in test_control_ops.py)."""

from __future__ import annotations

import errno
import os
import socket
import struct

from linkpassd.adapters import control_access
from linkpassd.adapters.control_access import SO_PEERGROUPS, _RateLimitedLog, peer_credentials


class ManyGroupsSocket:
    """A peer with more groups than 1024 bytes hold, as the kernel and
    Python answer for it: ERANGE for a buffer the kernel finds too small, and
    Python's own OSError (no errno) for any buflen over 1024."""

    def __init__(self, pid: int, uid: int, gid: int) -> None:
        self.creds = struct.pack("3i", pid, uid, gid)
        self.peergroups_buflens: list[int] = []

    def getsockopt(self, level: int, option: int, buflen: int) -> bytes:
        assert level == socket.SOL_SOCKET
        if option == socket.SO_PEERCRED:
            return self.creds
        assert option == SO_PEERGROUPS
        self.peergroups_buflens.append(buflen)
        if buflen > 1024:
            raise OSError("getsockopt buflen out of range")
        raise OSError(errno.ERANGE, os.strerror(errno.ERANGE))


def test_more_groups_than_so_peergroups_can_return_are_read_from_proc(monkeypatch) -> None:
    monkeypatch.setattr(control_access, "_proc_groups",
                        lambda pid: tuple(range(20000, 20300)) if pid == 4242 else ())
    fake = ManyGroupsSocket(pid=4242, uid=1000, gid=1000)
    creds = peer_credentials(fake)  # type: ignore[arg-type]
    assert creds.pid == 4242 and creds.uid == 1000
    assert creds.gids == frozenset({1000, *range(20000, 20300)})
    assert all(n <= 1024 for n in fake.peergroups_buflens)  # never a buflen Python refuses


def test_proc_groups_reads_the_groups_line_of_a_real_process() -> None:
    with open("/proc/self/status", encoding="ascii") as f:
        line = next(line for line in f if line.startswith("Groups:"))
    assert control_access._proc_groups(os.getpid()) == tuple(int(g) for g in line.split()[1:])
    assert control_access._proc_groups(2**22 + 1) == ()  # beyond pid_max: no such process


def test_refusals_are_logged_once_per_interval_per_reason_with_the_count_left_out() -> None:
    limiter = _RateLimitedLog(10.0)
    assert limiter.allow("per uid", 100.0) == 0
    assert limiter.allow("per uid", 101.0) is None
    assert limiter.allow("per uid", 109.9) is None
    assert limiter.allow("total", 105.0) == 0  # another reason has its own interval
    assert limiter.allow("per uid", 110.0) == 2  # two refusals went unlogged since the last line
    assert limiter.allow("per uid", 121.0) == 0
