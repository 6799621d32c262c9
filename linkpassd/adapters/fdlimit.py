"""The open-file limit (RLIMIT_NOFILE), raised at start and checked against
what the configuration needs.

Each connection, stream socket, probe socket and open file is a descriptor.
At the default soft limit of 1,024, 1,100 idle TCP connections to the
aggregator's port locked real agents out with nothing logged, and the same
limit capped a fleet near 1,000 hosts per process. So at start each daemon
raises its soft limit to the hard one (an unprivileged process may do that;
systemd's LimitNOFILE= sets the hard one), then compares it with what its
configuration needs and says so: `check()` returns the verdict, the caller
logs it and decides (the aggregator refuses to start below its need; a
host's daemon warns and keeps protecting the host).
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

NR_OPEN_FALLBACK = 1 << 20  # the kernel's default fs.nr_open, when the hard limit is "unlimited"


@dataclass(frozen=True)
class FdLimit:
    before: int  # soft limit found at start
    soft: int  # soft limit now
    hard: int
    needed: int
    error: str = ""  # why the soft limit could not be raised ("" when it was, or needed not)

    @property
    def enough(self) -> bool:
        return self.soft >= self.needed

    def describe(self) -> str:
        raised = f" (raised from {self.before})" if self.soft != self.before else ""
        text = f"open-file limit {self.soft}{raised}, hard {self.hard}; the configuration needs {self.needed}"
        if not self.enough:
            text += (f": too low, raise LimitNOFILE= in the unit (or `ulimit -n` in the shell that "
                     f"starts it) to at least {self.needed}")
        if self.error:
            text += f" ({self.error})"
        return text


def _nr_open() -> int:
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return NR_OPEN_FALLBACK


def raise_nofile(needed: int) -> FdLimit:
    """Raise the soft RLIMIT_NOFILE to the hard limit; report against `needed`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else _nr_open()
    error = ""
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            error = f"could not raise it: {exc}"
    now, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def shown(v: int) -> int:
        return _nr_open() if v == resource.RLIM_INFINITY else v
    return FdLimit(before=shown(soft), soft=shown(now), hard=shown(hard), needed=needed, error=error)
