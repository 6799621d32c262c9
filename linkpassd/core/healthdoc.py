"""The host's health document: what collective libraries and launchers read.

`/run/linkpass/health.json` (and the WatchHealth stream) says, per rail port,
whether a job may use it, so a launcher can leave a bad NIC out of
NCCL_IB_HCA before it starts.  The document carries its own freshness: the
daemon rewrites it before `valid_until`, so a file older than that means the
daemon is gone or stuck and the file must not be trusted.

Pure: the daemon's adapters write the file and give the times.
"""

from __future__ import annotations

from dataclasses import dataclass

from linkpassd.core.model import Verdict

FORMAT_VERSION = 1


@dataclass(frozen=True)
class PortHealthRow:
    port: str  # netdev
    rail: str
    rdma_device: str  # "" when the netdev has no RDMA device
    rdma_port: int  # 0 when none
    verdict: Verdict | None  # None: not judged yet
    since: float  # unix time of the last verdict change; 0 when not judged
    reason: str
    drained: bool

    @property
    def usable(self) -> bool:
        """A launcher may put this port in a job's device list."""
        return self.verdict is Verdict.UP and not self.drained


@dataclass(frozen=True)
class HealthDoc:
    hostname: str
    boot_id: str
    generation: int  # 1, 2, 3... within a boot
    written_at: float  # unix time
    valid_until: float  # unix time; later than this without a newer one: stale
    pid: int  # the daemon's
    ports: tuple[PortHealthRow, ...]
