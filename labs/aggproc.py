"""A linkpass-aggregator for a lab: started in the root namespace, reached over
a Unix socket.

The lab's daemons live in their hosts' network namespaces; a Unix socket in
the lab's work directory reaches them all without giving the aggregator an
address in any namespace, so no lab traffic leaves the lab and nothing
listens on the machine's network. The web page listens on loopback only.
Insecure mode (plaintext, host names trusted): labs only, and the aggregator
says so at start.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

READY_S = 30.0


def _free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AggregatorProc:
    """One aggregator process; `start()` returns once it serves, `stop()`
    ends it by PID. `pause()`/`resume()` freeze it (SIGSTOP/SIGCONT): an
    aggregator that is away without closing its connections."""

    def __init__(self, workdir: Path, *, heartbeat_s: float = 1.0, peers_per_rail: int = 3,
                 name: str = "aggregator", web: bool = True, postgresql_dsn: str = "",
                 database: Path | None = None, tcp: bool = False, metrics: bool = False,
                 validation_budget_pps: float | None = None):
        """`name` prefixes its files in `workdir` (several replicas may share
        one); `postgresql_dsn` selects the PostgreSQL store (else SQLite at
        `database`, default workdir/fleet.db); `web=False` serves no page;
        `tcp=True` listens on a free loopback TCP port instead of the Unix
        socket (a bench's agents connect as real ones do: over TCP);
        `metrics=True` serves Prometheus metrics at `metrics_url`;
        `validation_budget_pps`: [validation] host_budget_pps (None: the default)."""
        self.workdir = Path(workdir)
        self.name = name
        self.socket_path = self.workdir / f"{name}.sock"
        self.address = (f"127.0.0.1:{_free_loopback_port()}" if tcp else f"unix:{self.socket_path}")
        self.web_port = _free_loopback_port() if web else 0
        self.web_url = f"http://127.0.0.1:{self.web_port}/" if web else ""
        self.metrics_port = _free_loopback_port() if metrics else 0
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics" if metrics else ""
        self.config_path = self.workdir / f"{name}.toml"
        self.log_path = self.workdir / f"{name}.log"
        self.database = Path(database) if database is not None else self.workdir / "fleet.db"
        self.postgresql_dsn = postgresql_dsn
        self.heartbeat_s = heartbeat_s
        self.peers_per_rail = peers_per_rail
        self.validation_budget_pps = validation_budget_pps
        self.proc: subprocess.Popen | None = None
        self.paused = False

    def write_config(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        store = (f'store = "postgresql"\npostgresql_dsn = "{self.postgresql_dsn}"' if self.postgresql_dsn
                 else f'database = "{self.database}"')
        web = f"127.0.0.1:{self.web_port}" if self.web_port else ""
        metrics = f"127.0.0.1:{self.metrics_port}" if self.metrics_port else ""
        self.config_path.write_text(f"""# written by labs/aggproc.py
[aggregator]
listen = "{self.address}"
{store}
heartbeat_s = {self.heartbeat_s}

[tls]
insecure = true

[mesh]
peers_per_rail = {self.peers_per_rail}

[web]
listen = "{web}"

[metrics]
listen = "{metrics}"
""" + ("" if self.validation_budget_pps is None else
       f"\n[validation]\nhost_budget_pps = {float(self.validation_budget_pps)!r}\n"))

    def start(self) -> "AggregatorProc":
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("aggregator already running")
        self.write_config()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "linkpassd.aggregator.main",
                                          "--config", str(self.config_path)],
                                         stdout=log, stderr=subprocess.STDOUT)
        self.wait_serving(READY_S)
        return self

    def wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"aggregator exited with {self.proc.returncode}; its log:\n"
                                       + self.log_tail())
                try:
                    if stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0).status == \
                            health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.1)
        raise RuntimeError(f"aggregator not serving after {timeout:g} s; its log:\n"
                           + self.log_tail())

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        """SIGKILL: the aggregator dies with writes in flight and acks unsent."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 15 s; the exit status (None if never started)."""
        if self.proc is None:
            return None
        if self.paused:
            self.resume()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def ctl(self, *args: str, timeout: float = 20) -> subprocess.CompletedProcess:
        """`linkpassctl fleet ARGS` against this aggregator (insecure)."""
        return subprocess.run([sys.executable, "-m", "linkpassd.ctl.main", "fleet",
                               "--aggregator", self.address, "--insecure", *args],
                              capture_output=True, text=True, timeout=timeout)

    def channel(self) -> grpc.Channel:
        """A plaintext channel to the aggregator (the caller closes it)."""
        return grpc.insecure_channel(self.address)
