"""How fast and how long a validation run probes, from its probe plan.

Why a function of the plan: every host sends to its targets and answers its
probers at once, so what one host must handle is its *degree* (pairs it
sends on plus pairs it answers, over all its rails) times the per-target
rate. A fixed per-target rate that is harmless in a 6-host lab is ~140,000
probes/s on the busiest host of a 2,048 x 8 plan (280 pairs): no host
prober keeps that up, and late or dropped probes would read as loss. So
the rates are capped by a per-host probe budget shared out over the busiest
host's degree, and the burst lasts long enough that the *least* probed port
still sees enough probes to resolve the target loss rate. The aggregator
(aggregator.validation) sends what `schedule` returns; labs/bench/validate
uses the same function to model a run at scale, so the model and the code
cannot drift apart.

What a port resolves is validate.localize.detectable_loss (the one place
that computes it; probes_for is its inverse), over the burst probes of all
the pairs through that port.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from linkpassd.validate.localize import Thresholds, detectable_loss, probes_for
from linkpassd.validate.probeplan import ProbePlan

RATE_PPS = 10.0  # low-rate phase per target: loss and RTT percentiles without load
BURST_PPS = 500.0  # burst phase per target, at most (echo responders allow 5,000/s per source)
# Probes sent + answered per host per second. The validation prober and the
# echo responder are Python: ~35-60 us of CPU per probe measured on this
# project's 2-core VM (docs/measured.md, probe_scale), so 10,000/s is about half a core.
HOST_BUDGET_PPS = 10_000.0
TARGET_RESOLUTION = 0.001  # random loss per host port the burst should resolve
MIN_BURST_S = 2.0
MAX_BURST_SHARE = 0.4  # of the window: the low-rate phase keeps the rest


@dataclass(frozen=True)
class Schedule:
    rate_pps: float  # per target, low-rate phase
    burst_pps: float  # per target, burst phase
    burst_s: float
    host_load: int  # the busiest host's pairs, sent + answered
    port_load: int  # the least probed port's pairs, sent + answered
    resolution: float  # what that port resolves if every burst probe goes out

    @property
    def busiest_host_pps(self) -> float:
        return self.host_load * max(self.rate_pps, self.burst_pps)


def loads(probes: ProbePlan) -> tuple[int, int]:
    """(busiest host's degree over all its rails, least probed port's degree)."""
    per_host: dict[str, int] = defaultdict(int)
    per_port = []
    for (host, _rail), (sent, answered) in probes.degrees().items():
        per_host[host] += sent + answered
        per_port.append(sent + answered)
    return (max(per_host.values(), default=0), min((n for n in per_port if n), default=0))


def schedule(probes: ProbePlan, duration_s: float, *, rate_pps: float = RATE_PPS,
             burst_pps: float = BURST_PPS, budget_pps: float = HOST_BUDGET_PPS,
             target_resolution: float = TARGET_RESOLUTION, min_burst_s: float = MIN_BURST_S,
             max_burst_share: float = MAX_BURST_SHARE,
             thresholds: Thresholds = Thresholds()) -> Schedule:
    """The rates and burst length for a run of `duration_s` over `probes`."""
    if not math.isfinite(duration_s) or duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, not {duration_s!r}")
    host_load, port_load = loads(probes)
    cap = budget_pps / host_load if host_load else math.inf
    # rounded down to 1/1000 pps: never above the budget
    rate, burst = (math.floor(min(x, cap) * 1000) / 1000 for x in (rate_pps, burst_pps))
    needed = probes_for(target_resolution, thresholds.min_lost, thresholds.power)
    want_s = needed / (port_load * burst) if port_load and burst > 0 else min_burst_s
    burst_s = min(max(min_burst_s, math.ceil(want_s * 10) / 10), max_burst_share * duration_s)
    per_port = math.floor(burst * burst_s) * port_load
    return Schedule(rate, burst, round(burst_s, 3), host_load, port_load,
                    detectable_loss(per_port, thresholds.min_lost, thresholds.power))
