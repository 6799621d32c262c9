"""How long the echo responder holds a request, with its daemon busy: thread vs process.

    flock -w 900 /tmp/linkpass-lab.lock timeout 1200 \\
        python -m labs.bench.responder_hold --label NAME [--trials 5] [--seconds 5] [--pps 1000]

Two namespaces joined by a veth pair (198.18.201.1 probes, 198.18.201.2
answers). In the answering one runs a stand-in for linkpassd: an asyncio
event loop with the responder as the daemon runs it,
- `thread`: today's design, adapters.echoresponder.EchoResponder on a thread
  of the daemon's process, with the daemon's 1 ms interpreter switch interval;
- `process`: adapters.responderproc.ResponderProcess, the responder as a
  process of its own (linkpassd.responder), SCHED_FIFO 1 when allowed;
and a load:
- `idle`: nothing else;
- `gil`: a thread of the daemon's process sorting a 100,000-float list in a
  loop: each sort is one C call that holds the interpreter lock ~16 ms (more with every core busy),
  as a busy daemon does (a reload's parsing, a 256-path mesh's bookkeeping,
  a burst of events' logging);
- `reload`: a reload every 0.5 s, done as the daemon does it: for `thread`,
  a reload that changes echo timers closes the echo service, which joins the
  responder thread and binds the port anew; for `process`, the new policy
  is written to the responder's pipe;
- `cpu`: a busy loop per core, in processes of their own;
- `gil+cpu`: both.
The prober (its own process, SCHED_FIFO 50 when allowed, so the numbers are
the responder's, not the prober's) sends `--pps` requests a second for
`--seconds` and takes, for every reply: the round trip (kernel receive
timestamp minus the send time) and the responder's own `held_us` (kernel
receive to reply, as the responder computes it). A reply not back within
1 s is lost. Designs and loads run side by side within each trial, in turn.

Writes labs/bench/results/responder_hold-<label>.{json,png}: per design and
load, p50, p99, p99.99 and max of both quantities, the median over trials
of each trial's percentiles, and the same over all samples pooled; lost
replies per trial.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

PROBER_ADDR, RESPONDER_ADDR = "198.18.201.1", "198.18.201.2"
PORT = 4793
DESIGNS = ("thread", "process")
LOADS = ("idle", "gil", "reload", "cpu", "gil+cpu")
RESULTS = Path(__file__).parent / "results"
LOST_AFTER_S = 1.0
SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("@qq")
RELOAD_S = 0.5
GIL_LIST = 100_000


# --------------------------------------------------------------------------
# The daemon stand-in (runs in the responder's namespace)
# --------------------------------------------------------------------------


def _policy(rate: float):
    from linkpassd.core.admission import ResponderPolicy
    return ResponderPolicy.build([RESPONDER_ADDR], ["198.18.0.0/15"], rate_pps=rate,
                                 burst=100_000)


def gil_holder(stop: threading.Event, slices: list[float]) -> None:
    """Hold the interpreter lock in long slices: one C call (sorted) at a time."""
    rng = random.Random(1)
    data = [rng.random() for _ in range(GIL_LIST)]
    while not stop.is_set():
        t0 = time.perf_counter()
        sorted(data)
        slices.append(time.perf_counter() - t0)


async def host(design: str, load: str, seconds: float) -> None:
    from linkpassd.adapters.echoresponder import EchoResponder
    from linkpassd.adapters.responderproc import ResponderProcess
    loop = asyncio.get_running_loop()
    rates = iter([1e6, 1e6 + 1] * 10_000)  # a reload that changes something
    if design == "thread":
        sys.setswitchinterval(0.001)  # as linkpassd's main() set it for the thread
        responder = EchoResponder(PORT, policy=_policy(next(rates)))
        responder.start()
    else:
        responder = ResponderProcess(PORT, policy=_policy(next(rates)))
        responder.start()
        for _ in range(200):  # until the child has said it is running
            if responder.sched:
                break
            await asyncio.sleep(0.01)
    stop, slices, reloads = threading.Event(), [], 0
    if "gil" in load:
        threading.Thread(target=gil_holder, args=(stop, slices), daemon=True).start()
    print(json.dumps({"event": "ready", "sched": getattr(responder, "sched", "thread")}),
          flush=True)
    end = loop.time() + seconds
    while loop.time() < end:
        await asyncio.sleep(RELOAD_S if load == "reload" else 0.1)
        if load == "reload":
            reloads += 1
            if design == "thread":  # what the daemon once did on a reload: close the service, start a new one
                responder.close()
                responder = EchoResponder(PORT, policy=_policy(next(rates)))
                responder.start()
            else:
                responder.set_policy(_policy(next(rates)))
    stop.set()
    counters = (vars(responder.counters) if design == "thread" else responder.tally())
    responder.close()
    print(json.dumps({"event": "done", "counters": counters, "reloads": reloads,
                      "gil_slice_ms": (round(statistics.median(slices) * 1e3, 1)
                                       if slices else None)}), flush=True)


# --------------------------------------------------------------------------
# The prober (runs in the prober's namespace)
# --------------------------------------------------------------------------


def prober(pps: float, seconds: float) -> None:
    from linkpassd.adapters.echoresponder import KIND_REQUEST, MAGIC, PACKET, VERSION
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
    except OSError:
        pass
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    s.bind((PROBER_ADDR, 0))
    s.setblocking(False)
    pid = random.getrandbits(64) or 1
    sent: dict[int, int] = {}
    rtt, held = [], []
    t0 = time.monotonic()
    n = int(pps * seconds)
    seq = 0

    def drain() -> None:
        while True:
            try:
                data, anc, _f, _a = s.recvmsg(64, 64)
            except BlockingIOError:
                return
            rx = None
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    sec, nsec = _TIMESPEC.unpack_from(payload)
                    rx = sec * 1_000_000_000 + nsec
            if len(data) != PACKET.size or rx is None:
                continue
            f = PACKET.unpack(data)
            at = sent.pop(f[4], None)
            if at is None or f[6] != pid:
                continue
            rtt.append((rx - at) / 1e3)
            held.append(f[8])

    while seq < n:
        due = t0 + seq / pps
        wait = due - time.monotonic()
        if wait > 0:
            select.select([s], [], [], wait)  # sleeps: the prober must not take a core
            drain()
            if time.monotonic() < due:
                continue
        seq += 1
        at = time.time_ns()
        sent[seq] = at
        try:
            s.sendto(PACKET.pack(MAGIC, VERSION, KIND_REQUEST, 0, seq, at, pid, 0, 0),
                     (RESPONDER_ADDR, PORT))
        except OSError:
            pass
        drain()
    end = time.monotonic() + LOST_AFTER_S
    while sent and time.monotonic() < end:
        select.select([s], [], [], 0.01)
        drain()
    print(json.dumps({"sent": n, "lost": len(sent), "rtt_us": rtt, "held_us": held}))


def spin() -> None:
    end = time.monotonic() + float(sys.argv[-1])
    while time.monotonic() < end:
        pass


# --------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return float(xs[min(len(xs) - 1, int(q / 100 * len(xs)))])


QS = {"p50": 50, "p99": 99, "p99.99": 99.99, "max": 100}


def summary(xs: list[float]) -> dict[str, float | None]:
    return {k: pct(xs, q) for k, q in QS.items()}


def ns_exec(ns: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", ns, *args], **kw)


def trial(ns_a: str, ns_b: str, design: str, load: str, args) -> dict:
    me = [sys.executable, "-m", "labs.bench.responder_hold"]
    spinners: list[subprocess.Popen] = []
    h = ns_exec(ns_b, *me, "--role", "host", "--design", design, "--load", load,
                "--seconds", str(args.seconds + 3), stdout=subprocess.PIPE, text=True)
    try:
        ready = json.loads(h.stdout.readline() or "{}")
        assert ready.get("event") == "ready", f"host {design}/{load} did not start"
        if "cpu" in load:
            spinners = [subprocess.Popen([*me, "--role", "spin", "--seconds",
                                          str(args.seconds + 3)]) for _ in range(os.cpu_count())]
        time.sleep(0.5)
        p = ns_exec(ns_a, *me, "--role", "prober", "--pps", str(args.pps), "--seconds",
                    str(args.seconds), stdout=subprocess.PIPE, text=True)
        out, _ = p.communicate(timeout=args.seconds + 30)
        probe = json.loads(out)
        done = json.loads(h.stdout.readline() or "{}")
        h.wait(timeout=args.seconds + 30)
    finally:
        for proc in [h, *spinners]:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
    return {"sched": ready.get("sched"), "host": done, **probe}


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    width = 0.13
    for ax, what in zip(axes, ("rtt_us", "held_us")):
        for d, design in enumerate(DESIGNS):
            for k, q in enumerate(("p50", "p99", "p99.99")):
                xs = [i + (d * 3 + k - 2.5) * width for i in range(len(LOADS))]
                ys = [max(1.0, result["runs"][design][load][what]["median_of_trials"][q] or 1.0)
                      for load in LOADS]
                ax.bar(xs, ys, width, label=f"{design} {q}",
                       color=[("#9ecae1", "#3182bd", "#08519c"),
                              ("#fdae6b", "#e6550d", "#a63603")][d][k])
        ax.set_yscale("log")
        ax.set_xticks(range(len(LOADS)), LOADS)
        ax.set_title({"rtt_us": "prober's round trip (veth, kernel timestamps)",
                      "held_us": "responder's held_us (kernel receive to reply)"}[what])
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("µs (log), median of trials")
    axes[1].legend(fontsize=8, ncol=2)
    fig.suptitle(f"echo responder hold time, thread vs process "
                 f"({result['trials']} trials x {result['seconds']} s at {result['pps']}/s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def orchestrate(args) -> int:
    tag = f"{os.getpid()}"
    ns_a, ns_b = f"lprha{tag}", f"lprhb{tag}"
    created: list[str] = []
    try:
        for ns in (ns_a, ns_b):
            subprocess.run(["ip", "netns", "add", ns], check=True, timeout=10)
            created.append(ns)
            subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True, timeout=10)
        subprocess.run(["ip", "-n", ns_a, "link", "add", "lprh0", "type", "veth", "peer", "name",
                        "lprh1", "netns", ns_b], check=True, timeout=10)
        for ns, dev, addr in ((ns_a, "lprh0", PROBER_ADDR), (ns_b, "lprh1", RESPONDER_ADDR)):
            subprocess.run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev], check=True,
                           timeout=10)
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True, timeout=10)
        time.sleep(0.5)
        raw: dict = {d: {ld: [] for ld in LOADS} for d in DESIGNS}
        for t in range(args.trials):
            for load in LOADS:
                for design in (DESIGNS if t % 2 == 0 else DESIGNS[::-1]):
                    r = trial(ns_a, ns_b, design, load, args)
                    raw[design][load].append(r)
                    print(f"trial {t} {design:7} {load:8} rtt p50 {pct(r['rtt_us'], 50):8.1f} "
                          f"p99 {pct(r['rtt_us'], 99):8.1f} p99.99 {pct(r['rtt_us'], 99.99):8.1f}"
                          f" | held p50 {pct(r['held_us'], 50):7.0f} p99 {pct(r['held_us'], 99):7.0f}"
                          f" p99.99 {pct(r['held_us'], 99.99):7.0f} lost {r['lost']} "
                          f"[{r['sched']}; gil slice {r['host'].get('gil_slice_ms')} ms]",
                          flush=True)
    finally:
        for ns in created:
            subprocess.run(["ip", "netns", "delete", ns], timeout=10)
    result = {"label": args.label, "trials": args.trials, "seconds": args.seconds,
              "pps": args.pps, "cpus": os.cpu_count(), "kernel": os.uname().release,
              "command": " ".join(sys.argv), "runs": {}}
    for design in DESIGNS:
        result["runs"][design] = {}
        for load in LOADS:
            rs = raw[design][load]
            entry = {"lost": [r["lost"] for r in rs], "sent": [r["sent"] for r in rs],
                     "sched": rs[0]["sched"],
                     "gil_slice_ms": [r["host"].get("gil_slice_ms") for r in rs],
                     "reloads": [r["host"].get("reloads") for r in rs]}
            for what in ("rtt_us", "held_us"):
                per = [summary(r[what]) for r in rs]
                entry[what] = {
                    "median_of_trials": {k: statistics.median(p[k] for p in per if p[k] is not None)
                                         for k in QS},
                    "pooled": summary([x for r in rs for x in r[what]]),
                    "per_trial": per}
            result["runs"][design][load] = entry
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"responder_hold-{args.label}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, out.with_suffix(".png"))
    print(f"\n{'design':8} {'load':8} | round trip µs p50 / p99 / p99.99 | held_us p50 / p99 / "
          f"p99.99 | lost (median of {args.trials} trials)")
    for design in DESIGNS:
        for load in LOADS:
            e = result["runs"][design][load]
            r, h = e["rtt_us"]["median_of_trials"], e["held_us"]["median_of_trials"]
            print(f"{design:8} {load:8} | {r['p50']:8.0f} {r['p99']:8.0f} {r['p99.99']:8.0f} | "
                  f"{h['p50']:7.0f} {h['p99']:7.0f} {h['p99.99']:7.0f} | "
                  f"{statistics.median(e['lost']):.0f}")
    print(f"\nwrote {out} and {out.with_suffix('.png')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="labs.bench.responder_hold",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--role", choices=("run", "host", "prober", "spin"), default="run",
                    help=argparse.SUPPRESS)
    ap.add_argument("--design", choices=DESIGNS, help=argparse.SUPPRESS)
    ap.add_argument("--load", choices=LOADS, help=argparse.SUPPRESS)
    ap.add_argument("--label", default="run", help="results file suffix")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=5.0, help="probing per trial")
    ap.add_argument("--pps", type=float, default=1000.0, help="requests per second")
    args = ap.parse_args(argv)
    if not (args.trials >= 1 and 0 < args.seconds <= 60 and 0 < args.pps <= 20_000):
        ap.error("need --trials >= 1, 0 < --seconds <= 60, 0 < --pps <= 20000")
    if args.role == "host":
        import structlog  # the responder's log lines to stderr: stdout is the run's pipe
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        asyncio.run(host(args.design, args.load, args.seconds))
        return 0
    if args.role == "prober":
        prober(args.pps, args.seconds)
        return 0
    if args.role == "spin":
        spin()
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
