"""linkpassctl's exit codes: what a script can branch on.

Shared, not linkpassctl's own module: fleet validation's report
(validate.report) says which code its findings mean, and must not reach into
the ctl program for it.

| code | name        | meaning                                                              |
|------|-------------|----------------------------------------------------------------------|
| 0    | OK          | the command did what was asked                                       |
| 1    | FAILURE     | any other failure (the daemon answered with an error not below)     |
| 2    | USAGE       | bad argument or option (click's usage errors; a malformed duration)  |
| 3    | UNREACHABLE | linkpassd absent or not answering: no socket, connection refused,    |
|      |             | deadline exceeded                                                    |
| 4    | REFUSED     | not allowed: PERMISSION_DENIED from the daemon, or no permission on  |
|      |             | the socket                                                           |
| 5    | NOT_FOUND   | the daemon does not know it: unknown port, port not drained          |
| 6    | STALE       | health data stale or unusable (nccl-env: health.json missing,        |
|      |             | unreadable, or written by a daemon that is gone)                     |
| 7    | NO_USABLE   | nothing usable (nccl-env: no port is healthy)                        |
| 8    | FINDINGS    | validate ran and found a problem (a finding in the report, e.g. a    |
|      |             | miswired cable, a bad optic, a host that gave no result)             |

Why these splits: a launcher wrapping `nccl-env` must tell "daemon gone, fall
back to the static NIC list" (3, 6) from "every NIC is bad, do not start" (7);
a drain script must tell "you are not root" (4) from "typo in the port name"
(5) from "bad --for" (2); a hand-over script must tell "the cluster has a
fault" (8) from "the validation could not run" (1-4). 2 is click's own code
for usage errors, so it is kept. The table above is the one docs/operating.md and `linkpassctl --help` show
(`EPILOG` renders it).
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILURE = 1
    USAGE = 2
    UNREACHABLE = 3
    REFUSED = 4
    NOT_FOUND = 5
    STALE = 6
    NO_USABLE = 7
    FINDINGS = 8


MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "ok",
    ExitCode.FAILURE: "other failure",
    ExitCode.USAGE: "bad argument or option",
    ExitCode.UNREACHABLE: "linkpassd absent or not answering (no socket, refused, deadline)",
    ExitCode.REFUSED: "refused (permission denied by linkpassd or on the socket)",
    ExitCode.NOT_FOUND: "not found (unknown port, port not drained)",
    ExitCode.STALE: "health data stale or unusable (nccl-env)",
    ExitCode.NO_USABLE: "no usable port (nccl-env)",
    ExitCode.FINDINGS: "validation found a problem (validate: findings in the report)",
}


def epilog() -> str:
    """The exit-code table for `linkpassctl --help`. `\\b` stops click from
    rewrapping the lines into one paragraph."""
    lines = ["\b", "Exit codes:"]
    lines += [f"  {int(code)}  {MEANINGS[code]}" for code in ExitCode]
    return "\n".join(lines)
