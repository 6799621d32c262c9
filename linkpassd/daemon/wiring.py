"""What the daemon's services are made of, derived from the config: BFD
sessions, the echo service's paths and timers, the sensor backend. Pure
derivations plus the one place that reconciles the BFD agent's sessions with
the config; the daemon calls these at start and on every reload.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from linkpassd.adapters.bfd import BfdAgent, PeerSpec
from linkpassd.adapters.echo import ProbePath
from linkpassd.adapters.ethtool import EthtoolSensor
from linkpassd.adapters.sensor import Sensor
from linkpassd.adapters.simsensor import SimulatedSensor
from linkpassd.core import bfd
from linkpassd.core.admission import ResponderPolicy
from linkpassd.core.model import Config
from linkpassd.core.probe import ProbeConfig


def bfd_specs(config: Config) -> dict[str, PeerSpec]:
    """One BFD session per rail that asks for it, with the rail's gateway."""
    interval_us = config.bfd.interval_ms * 1000
    timers = bfd.SessionConfig(desired_min_tx_us=interval_us, required_min_rx_us=interval_us,
                               detect_mult=config.bfd.detect_mult)
    specs = (PeerSpec(ifname=r.port, local=r.address, peer=r.gateway, config=timers,
                      name=f"bfd:{r.gateway}") for r in config.rails if r.bfd)
    return {spec.key: spec for spec in specs}


def sync_bfd(agent: BfdAgent, config: Config) -> dict[str, tuple[PeerSpec, str]]:
    """Make the agent's sessions the config's: at start, on every reload and
    to retry. A session whose port, address or timers changed is started
    anew. Returns the sessions that could not start (their port or address
    is missing), with the reason; the others run regardless."""
    wanted = bfd_specs(config)
    for name, run in list(agent.runs.items()):
        if wanted.get(name) != run.spec:
            agent.remove(name)
    failed = {}
    for name, spec in wanted.items():
        if name not in agent.runs:
            try:
                agent.add(spec)
            except OSError as exc:
                failed[name] = (spec, f"{spec.ifname}: {exc.strerror or exc}")
    return failed


@dataclass(frozen=True)
class EchoSpec:
    """What the echo service is made of; a change means a new service."""

    paths: tuple[ProbePath, ...]
    probe: ProbeConfig
    port: int
    tos: int
    heartbeat_s: float | None
    responder: ResponderPolicy  # what our responder answers (core.admission)


def echo_spec(config: Config,
              mesh_peers: Mapping[str, Sequence[str]] | None = None,
              mesh_probers: Mapping[str, Sequence[str]] | None = None) -> EchoSpec | None:
    """None when probing is off. On, the responder runs even without peers:
    other hosts may probe us. `mesh_peers`: per rail name, the peers the
    aggregator's probe mesh hands out (validated, agent.reports); each rail
    probes the union of its config's probe_peers and those, in that order.
    `mesh_probers`: the hosts the mesh has probing us; the responder answers
    them too (the mesh is not symmetric)."""
    p = config.probes
    if not p.enabled:
        return None
    mesh = mesh_peers or {}
    peers = {r.name: tuple(dict.fromkeys((*r.probe_peers, *mesh.get(r.name, ()))))
             for r in config.rails}
    paths = tuple(ProbePath(port=r.port, source=r.address, peer=peer)
                  for r in config.rails for peer in peers[r.name])
    probe = ProbeConfig(interval_s=p.interval_ms / 1e3, tolerance_s=p.tolerance_ms / 1e3,
                        suspect_after_s=p.suspect_ms / 1e3, confirm_probes=p.confirm_probes,
                        rise=p.rise, loss_window=p.loss_window, max_loss_ratio=p.max_loss_ratio,
                        clear_loss_ratio=p.clear_loss_ratio)
    responder = ResponderPolicy.build(
        (r.address for r in config.rails), p.fabric_prefixes,
        (*(peer for r in config.rails for peer in peers[r.name]),
         *(src for r in config.rails for src in (mesh_probers or {}).get(r.name, ()))),
        rate_pps=p.responder_rate_pps, burst=p.responder_burst)
    return EchoSpec(paths, probe, p.port, p.tos,
                    p.lag_heartbeat_ms / 1e3 if p.lag_heartbeat_ms > 0 else None, responder)


def make_sensor(config: Config) -> Sensor:
    if config.sensors.backend == "sim":
        return SimulatedSensor(config.sensors.sim_dir)
    return EthtoolSensor(min_module_interval_s=min(1.0, config.sensors.optics_interval_s))

