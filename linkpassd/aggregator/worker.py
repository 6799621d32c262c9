"""Pure-Python work too big for the aggregator's event loop, in a worker process.

The mesh plan and a fleet validation's probe plan and localisation are pure
Python and take seconds of CPU at thousands of hosts (16,384 hosts x 8
rails: ~30 s for the mesh; 2,048 x 8: ~8 s to plan a validation and ~7 s to
localise its results). Run on the loop, every agent's stream waits that
long for its acks; run on a thread, the thread holds the GIL for most of it
and the loop waits anyway. So above a size they run in one spawned worker
process (spawn, not fork: forking a process that runs grpc's threads is
unsafe), started at the first big job, kept for the next, and killed at
stop, even mid-job (a stopping aggregator must not wait for a result nobody
will use). If that process cannot run, the job runs on a thread: slower for
everyone, but done.

Jobs and their arguments must pickle: module-level functions, dataclasses,
protobuf messages, plain tuples.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

import structlog

log = structlog.get_logger("linkpassd.aggregator")

T = TypeVar("T")

OFF_LOOP_ABOVE_HOSTS = 512  # below this the jobs take milliseconds: the loop runs them


class WorkerStopped(Exception):
    """The job's process was stopped by close() while it ran: no result."""


class Worker:
    """One lazily started worker process shared by an aggregator's big jobs."""

    def __init__(self, name: str) -> None:
        self.name = name  # for the log
        self._pool: ProcessPoolExecutor | None = None
        self.jobs = 0  # jobs sent to the process (tests)

    async def run(self, hosts: int, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)`: here and now for a small fleet (`hosts` at most
        OFF_LOOP_ABOVE_HOSTS), else in the worker process."""
        if hosts <= OFF_LOOP_ABOVE_HOSTS:
            return fn(*args)
        job = functools.partial(fn, *args)
        pool = None
        try:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(max_workers=1,
                                                 mp_context=multiprocessing.get_context("spawn"))
            pool = self._pool
            self.jobs += 1
            return await asyncio.get_running_loop().run_in_executor(pool, job)
        except (BrokenProcessPool, OSError) as exc:
            if pool is not None and pool is not self._pool:  # close() killed it: stopping, not failing
                raise WorkerStopped(f"the {self.name} worker was stopped during the job") from None
            log.warning("worker_process_failed", worker=self.name, fallback="thread",
                        error=str(exc) or type(exc).__name__)
            self.close()
            return await asyncio.to_thread(job)

    def close(self) -> None:
        """Stop the process, even mid-job."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        # ProcessPoolExecutor has no public kill before Python 3.14; its
        # processes are in _processes. Terminate them, then let it clean up.
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
