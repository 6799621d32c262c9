"""A private, throwaway PostgreSQL for tests and benches.

    with private_postgres() as pg:
        dsn = pg.create_database("fleet")   # postgresql://linkpass@/fleet?host=...&port=...

Why it looks like this:

- **Never the machine's own cluster.** No pg_ctlcluster, no systemctl, no TCP:
  initdb writes a new cluster into a fresh temporary directory and `postgres`
  listens only on a Unix socket in that directory (listen_addresses = ''), so
  nothing else can reach it and it cannot clash with a system cluster.
- **Real durability.** fsync and synchronous_commit stay on: what the store
  promises (an ack only after a durable commit) is what is tested, and a bench
  measures real commit costs. (initdb itself runs with --no-sync: the cluster
  is thrown away, and its template files need no flush to be correct.)
- **Never root.** PostgreSQL refuses to run as root; when we are root, initdb
  and postgres run as nobody:nogroup (setpriv, which execs, so the PID we hold
  is the postmaster's own) in a directory chowned to that user.
- **Bounded and self-cleaning.** Start waits for connections up to a deadline
  (and fails fast, with the server's log, if the postmaster exits). Stop is by
  PID: SIGINT (PostgreSQL's fast shutdown, which disconnects clients; SIGTERM
  is its "smart" mode, which waits for every client to leave), then SIGKILL
  after a bound; the directory is removed in `finally`. The postmaster also
  gets SIGINT if the process that started it dies (setpriv --pdeathsig), so a
  killed test run leaves no server behind.

Needs only the PostgreSQL server binaries (Debian: the `postgresql` package;
found under /usr/lib/postgresql/*/bin, newest first, or on PATH).
"""

from __future__ import annotations

import contextlib
import glob
import grp
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

START_S = 60.0  # initdb + first connection, on a busy 2-core machine
STOP_S = 30.0  # fast shutdown before SIGKILL
PORT = 55432  # names the socket file only (.s.PGSQL.55432): nothing listens on TCP
SUPERUSER = "linkpass"
UNPRIVILEGED = ("nobody", "nogroup")


class PostgresUnavailable(RuntimeError):
    """The PostgreSQL server binaries are not installed (tests skip on this)."""


def find_bindir() -> Path:
    """The newest /usr/lib/postgresql/<version>/bin holding initdb and
    postgres, else the directory of `postgres` on PATH."""
    def version(path: str) -> tuple[int, ...]:
        match = re.search(r"/postgresql/([\d.]+)/bin$", path)
        return tuple(int(p) for p in match.group(1).split(".") if p) if match else ()

    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    for found in shutil.which("postgres"), shutil.which("initdb"):
        if found:
            candidates.append(str(Path(found).resolve().parent))
    for candidate in candidates:
        if all(os.access(Path(candidate) / tool, os.X_OK) for tool in ("initdb", "postgres", "psql")):
            return Path(candidate)
    raise PostgresUnavailable("PostgreSQL server binaries (initdb, postgres, psql) not found under "
                              "/usr/lib/postgresql/*/bin or on PATH; install Debian's postgresql package "
                              "(scripts/bootstrap.sh does)")


@dataclass
class PrivatePostgres:
    """A running private cluster: its directory, socket and postmaster PID."""

    bindir: Path
    workdir: Path
    proc: subprocess.Popen | None = None
    databases: list[str] = field(default_factory=list)

    @property
    def datadir(self) -> Path:
        return self.workdir / "data"

    @property
    def log_path(self) -> Path:
        return self.workdir / "postgres.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def dsn(self, database: str = "postgres") -> str:
        """A postgresql:// URL reaching `database` over the private socket."""
        return f"postgresql://{SUPERUSER}@/{database}?host={self.workdir}&port={PORT}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run one SQL command as the superuser; its output (ON_ERROR_STOP: a
        failure raises CalledProcessError with psql's message)."""
        done = subprocess.run(
            [str(self.bindir / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
             "-h", str(self.workdir), "-p", str(PORT), "-U", SUPERUSER, "-d", database, "-c", sql],
            capture_output=True, text=True, timeout=START_S, check=False)
        if done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, f"psql -c {sql!r}", done.stdout, done.stderr)
        return done.stdout

    def create_database(self, name: str) -> str:
        """A new empty database (lower-case letters, digits, _); its DSN."""
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
            raise ValueError(f"database name {name!r}: use lower-case letters, digits and _ (at most 63)")
        self.psql(f'CREATE DATABASE "{name}"')
        self.databases.append(name)
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop `name`, disconnecting whoever is still on it."""
        self.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self.databases:
            self.databases.remove(name)


def _as_unprivileged() -> list[str]:
    """The command prefix that runs PostgreSQL's programs: as nobody:nogroup
    when we are root (PostgreSQL refuses root), as ourselves otherwise; both
    with the parent-death signal, where setpriv is there."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0:
        return [setpriv, "--pdeathsig", "INT"] if setpriv else []
    if setpriv:
        user, group = UNPRIVILEGED
        return [setpriv, f"--reuid={user}", f"--regid={group}", "--clear-groups", "--pdeathsig", "INT"]
    runuser = shutil.which("runuser")
    if runuser:
        # runuser stays the parent of what it runs; signals to it are passed on.
        return [runuser, "-u", UNPRIVILEGED[0], "--"]
    raise PostgresUnavailable("running as root and neither setpriv nor runuser is installed to run "
                              "PostgreSQL as an unprivileged user")


def _start(pg: PrivatePostgres, prefix: list[str], deadline_s: float) -> None:
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "TZ": "UTC"}
    env.pop("PGDATA", None)
    initdb = subprocess.run(
        [*prefix, str(pg.bindir / "initdb"), "-D", str(pg.datadir), "-U", SUPERUSER, "--auth=trust",
         "--encoding=UTF8", "--locale=C", "--no-sync"],
        capture_output=True, text=True, timeout=deadline_s, env=env, cwd=pg.workdir, check=False)
    if initdb.returncode != 0:
        raise RuntimeError(f"initdb into {pg.datadir} failed ({initdb.returncode}): "
                           f"{(initdb.stderr or initdb.stdout).strip()[-2000:]}")
    settings = {
        "listen_addresses": "",
        "unix_socket_directories": str(pg.workdir),
        "port": str(PORT),
        "fsync": "on",
        "synchronous_commit": "on",
        "max_connections": "200",
        "shared_buffers": "32MB",
        "logging_collector": "off",
    }
    args = [a for key, value in settings.items() for a in ("-c", f"{key}={value}")]
    log = open(pg.log_path, "ab")  # the child keeps writing it; closed below
    try:
        pg.proc = subprocess.Popen([*prefix, str(pg.bindir / "postgres"), "-D", str(pg.datadir), *args],
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd=pg.workdir)
    finally:
        log.close()
    end = time.monotonic() + deadline_s
    socket_file = pg.workdir / f".s.PGSQL.{PORT}"
    while True:
        if pg.proc.poll() is not None:
            raise RuntimeError(f"postgres exited with status {pg.proc.returncode} before accepting "
                               f"connections: {_tail(pg.log_path)}")
        if socket_file.exists():
            ready = subprocess.run([str(pg.bindir / "pg_isready"), "-q", "-h", str(pg.workdir),
                                    "-p", str(PORT), "-U", SUPERUSER, "-d", "postgres"],
                                   capture_output=True, timeout=deadline_s, check=False)
            if ready.returncode == 0:
                return
        if time.monotonic() > end:
            raise RuntimeError(f"postgres did not accept connections within {deadline_s:g} s: "
                               f"{_tail(pg.log_path)}")
        time.sleep(0.05)


def _stop(pg: PrivatePostgres, stop_s: float) -> None:
    proc = pg.proc
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGINT)  # fast shutdown
    try:
        proc.wait(timeout=stop_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=stop_s)


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        return path.read_text(errors="replace").strip()[-limit:] or "(empty log)"
    except OSError as exc:
        return f"(no log: {exc})"


@contextlib.contextmanager
def private_postgres(*, start_s: float = START_S, stop_s: float = STOP_S) -> Iterator[PrivatePostgres]:
    """A private cluster for the `with` block; stopped and deleted after it.
    PostgresUnavailable when the binaries are missing; RuntimeError (with the
    server's log) when it cannot start."""
    bindir = find_bindir()
    prefix = _as_unprivileged()
    # Short, in /tmp: the socket path must stay under the 107-byte limit.
    workdir = Path(tempfile.mkdtemp(prefix="lp-pg-", dir="/tmp"))
    pg = PrivatePostgres(bindir=bindir, workdir=workdir)
    try:
        if os.geteuid() == 0:  # the server runs as nobody (see _as_unprivileged)
            os.chown(workdir, pwd.getpwnam(UNPRIVILEGED[0]).pw_uid, grp.getgrnam(UNPRIVILEGED[1]).gr_gid)
        _start(pg, prefix, start_s)
        yield pg
    finally:
        try:
            _stop(pg, stop_s)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":  # a manual check: start, print the DSN, stop on Enter
    with private_postgres() as cluster:
        print(cluster.dsn(), "pid", cluster.pid, flush=True)
        with contextlib.suppress(EOFError, KeyboardInterrupt):
            input("Enter stops it: ")
