"""Configs and port states for core tests, built directly (no TOML)."""

from linkpassd.core.model import Config, MultipathConfig, PortState, RailConfig, Timers, Verdict


def rails_config(n=2, backups="ring", multipath=True, min_paths=1, buckets=16) -> Config:
    rails = []
    for i in range(n):
        if backups == "ring":
            order = tuple(f"rail{(i + k) % n}" for k in range(1, n))
        else:
            order = ()
        rails.append(RailConfig(name=f"rail{i}", port=f"eth{i}", address=f"198.18.{i}.1",
                                prefixlen=24, gateway=f"198.18.{i}.254", table=10100 + i,
                                backups=order))
    mps = ()
    if multipath:
        mps = (MultipathConfig(name="fabric", destination="198.19.0.0/16",
                               rails=tuple(r.name for r in rails), table=10150,
                               buckets=buckets, min_paths=min(min_paths, n)),)
    return Config(rails=tuple(rails), multipath=mps, timers=Timers())


def port(name, verdict=Verdict.UP, carrier=None):
    if carrier is None:
        carrier = verdict is not Verdict.DOWN
    return PortState(port=name, verdict=verdict, carrier=carrier, phase=str(verdict), since=0.0)


def ports(config, **overrides):
    out = {r.port: port(r.port) for r in config.rails}
    for name, value in overrides.items():
        out[name] = value
    return out
