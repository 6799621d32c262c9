"""Run a command inside the file system a hardened systemd unit would give it
(the test's stand-in for systemd, which is not PID 1 on this machine).

Run it in a mount namespace of its own, after `unshare --mount --propagation
private`; it changes only that namespace's mounts, then execs the command (so
the PID the caller holds is the command's):

    unshare --mount --propagation private python _hardened_exec.py \\
        [--writable DIR]... [--private-tmp] [--protect-kernel-tunables] -- COMMAND...

  * every mount is remounted read-only (ProtectSystem=strict), except the API
    file systems under /proc and /dev (and /sys unless
    --protect-kernel-tunables, which also makes /proc/sys read-only);
  * each --writable DIR stays writable (systemd's StateDirectory=,
    RuntimeDirectory=, ReadWritePaths=): bound onto itself first, so it is
    its own mount and is not remounted;
  * --private-tmp: a fresh tmpfs on /tmp and /var/tmp (PrivateTmp=); a
    --keep DIR under them (the tree that stands in for the installed program,
    e.g. a checkout in /tmp) is bound back, read-only, at its own path.

Any mount that fails ends it with the mount's message, before the command runs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

API_FS = ("/proc", "/dev")


def mount(*args: str) -> None:
    proc = subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        sys.exit(f"_hardened_exec: mount {' '.join(args)}: {proc.stderr.strip()}")


def mount_points() -> list[str]:
    """Mount points of this namespace, in mount order (mountinfo field 5,
    octal escapes decoded)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        points = [line.split()[4] for line in f]
    return [p.encode().decode("unicode_escape") for p in points]


def under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--writable", action="append", default=[])
    parser.add_argument("--private-tmp", action="store_true")
    parser.add_argument("--keep", action="append", default=[])
    parser.add_argument("--protect-kernel-tunables", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        sys.exit("_hardened_exec: no command")
    writable = [os.path.realpath(w) for w in args.writable]
    for path in writable:
        mount("--bind", path, path)
    keep = set(writable)
    api = API_FS if args.protect_kernel_tunables else (*API_FS, "/sys")
    if args.protect_kernel_tunables:
        mount("--bind", "/proc/sys", "/proc/sys")
        mount("-o", "remount,bind,ro", "/proc/sys")
    for point in dict.fromkeys(mount_points()):
        if point in keep or any(under(point, top) for top in api):
            continue
        mount("-o", "remount,bind,ro", point)
    if args.private_tmp:
        tmps = ("/tmp", "/var/tmp")
        kept = {}  # path -> an fd open on it before the tmpfs hides it
        wanted = [p for p in dict.fromkeys(os.path.realpath(k) for k in args.keep)
                  if any(under(p, tmp) for tmp in tmps)]
        for path in wanted:  # the outermost only: a bind brings what is below it
            if not any(other != path and under(path, other) for other in wanted):
                kept[path] = os.open(path, os.O_PATH | os.O_DIRECTORY)
        for tmp in tmps:
            mount("-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", tmp)
        for path, fd in kept.items():
            os.makedirs(path, exist_ok=True)
            mount("--no-canonicalize", "--bind", f"/proc/{os.getpid()}/fd/{fd}", path)
            mount("-o", "remount,bind,ro", path)
            os.close(fd)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
