"""The timers and thresholds of a path's prober (ProbeConfig) and the
arithmetic that follows from them: the worst-case detection time and the
burst that keeps random loss from faking a DOWN. core.probe explains the
judgement they serve, and re-exports all three."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeConfig:
    """Timers and thresholds of one path's prober (defaults: see the module docstring)."""

    interval_s: float = 0.050  # steady probes, one per interval
    timeout_s: float = 0.008  # a reply later than this is a miss
    burst_count: int = 8  # confirmation probes on a clean path; more when it already loses some
    burst_interval_s: float = 0.0005  # spacing of the confirmation probes
    burst_max: int = 32  # cap on a burst, replacements for unjudged probes included
    false_down_odds: float = 1e-9  # wanted chance, per steady probe, that random loss fakes DOWN
    rise: int = 3  # on-time replies in a row before a path is UP (first time, or after DOWN)
    loss_window: int = 200  # steady outcomes the loss ratio is taken over
    max_loss_ratio: float = 0.20  # DEGRADED above this share of lost steady probes...
    clear_loss_ratio: float = 0.10  # ...and no longer at or below this one
    max_stall_ratio: float = 1.0  # a miss is unknown if our stalls covered this share of the timeout
    lag_tolerance_s: float = 0.001  # loop lag below this is ordinary jitter, not a stall
    refused_grace_s: float = 2.0  # misses are unknown this long after an ICMP port unreachable
    peer_grace_s: float = 0.025  # a lost burst with no live witness waits this long for a late reply
    # An unanswered steady probe raises suspicion this soon (its outcome, for
    # the loss window, still waits for timeout_s): a suspicion only costs a
    # burst, and every later step waits for it.
    suspect_after_s: float = 0.003
    # A confirmation probe is lost once the peer's daemon answered a probe
    # sent after it on another path and this long has passed since that
    # reply (or 4 round trips of this path, if longer); None: timeouts only.
    order_margin_s: float | None = None  # off by default: see the schema (order_margin_ms)

    def __post_init__(self) -> None:
        problems = []
        if not self.interval_s > 0:
            problems.append("interval_s must be > 0")
        if not 0 < self.timeout_s < self.interval_s:
            problems.append("timeout_s must be > 0 and below interval_s")
        if not 1 <= self.burst_count <= self.burst_max:
            problems.append("need 1 <= burst_count <= burst_max")
        if not 0 < self.false_down_odds < 1:
            problems.append("false_down_odds must be in (0, 1)")
        if self.burst_interval_s < 0:
            problems.append("burst_interval_s must be >= 0")
        if self.rise < 1:
            problems.append("rise must be >= 1")
        if self.loss_window < 1:
            problems.append("loss_window must be >= 1")
        if not 0 <= self.clear_loss_ratio < self.max_loss_ratio <= 1:
            problems.append("need 0 <= clear_loss_ratio < max_loss_ratio <= 1")
        if not 0 < self.max_stall_ratio <= 1:
            problems.append("max_stall_ratio must be in (0, 1]")
        if self.lag_tolerance_s < 0 or self.refused_grace_s < 0 or self.peer_grace_s < 0:
            problems.append("lag_tolerance_s, refused_grace_s and peer_grace_s must be >= 0")
        if not 0 < self.suspect_after_s <= self.timeout_s:
            problems.append("suspect_after_s must be > 0 and at most timeout_s")
        if self.order_margin_s is not None and not self.order_margin_s >= 0:
            problems.append("order_margin_s must be >= 0 (or None)")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def stall_budget_s(self) -> float:
        """Stalled time within a probe's flight that makes its miss unknown."""
        return self.timeout_s * self.max_stall_ratio


def detection_bound_s(config: ProbeConfig, burst: int | None = None,
                      witnessed: bool = False, ordered_rtt_s: float | None = None) -> float:
    """Worst-case time from the last good reply to DOWN on a blackhole, with a
    burst of `burst` probes (default: `burst_count`, what a clean path uses).
    `witnessed`: another live path of the host answered during the burst;
    without one, DOWN waits `peer_grace_s` more for a stalled peer's reply.
    `ordered_rtt_s`: the peer's daemon, on another path, answered a probe
    sent after the burst's last (its round trip): the burst is judged
    `order_margin_s` after that reply, not a timeout after the last probe."""
    k = config.burst_count if burst is None else burst
    if ordered_rtt_s is not None and config.order_margin_s is not None:
        last, grace = ordered_rtt_s + config.order_margin_s, 0.0
    else:
        last, grace = config.timeout_s, 0.0 if witnessed else config.peer_grace_s
    return (config.interval_s + config.suspect_after_s + (k - 1) * config.burst_interval_s
            + last + grace)


def burst_size(config: ProbeConfig, loss_ratio: float) -> int:
    """Confirmation probes needed so that random loss at `loss_ratio` (per probe
    exchange) fakes a DOWN with at most `false_down_odds` per steady probe: the
    trigger and all k burst probes must be lost, so loss**(k+1) <= odds."""
    if loss_ratio <= 0:
        return config.burst_count
    if loss_ratio >= 1:
        return config.burst_max
    need = math.ceil(math.log(config.false_down_odds) / math.log(loss_ratio) - 1e-9) - 1
    return min(config.burst_max, max(config.burst_count, need))
