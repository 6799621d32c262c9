"""The FRR side of ``[announce]`` (docs/bgp.md): the zebra and bgpd config a
host needs so that FRR announces what linkpassd writes in its announcement
table, derived from linkpassd's config.

- zebra imports the table (``ip import-table <table>``) and keeps out of
  the kernel's nexthop objects (``no zebra nexthop kernel enable``), whose
  ids linkpassd owns;
- bgpd redistributes it (``redistribute table <table>``), accepting only the
  host's rail addresses;
- one eBGP session per rail, toward the rail's gateway (the leaf), sourced
  from the rail address;
- per session, an outbound route-map that passes exactly the routes whose
  metric names that rail (core.announce.metric_of): the rail's own address
  with MED ``owner_med``, another rail's address (a detour) with MED 0, so a
  detour wins over a usable own-rail announcement that a broken session could
  not withdraw, and a settling one (an address on its way back from a detour
  over that rail) with MED 0 and ``settle_community`` (NO_EXPORT by default:
  the leaf keeps it and passes it on to nobody).
  Everything else is denied.

``python -m linkpassd.announce_frr /etc/linkpass/linkpassd.toml`` prints it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from linkpassd.core.announce import metric_of, settle_metric_of
from linkpassd.core.model import Config


class SnippetError(ValueError):
    pass


def _name(prefix: str, rail: str) -> str:
    return f"lp-{prefix}-{rail}"


def zebra_config(config: Config) -> str:
    """zebra imports the announcement table and installs its routes without
    kernel nexthop objects: zebra numbers its nexthop objects above the
    highest id it finds in the kernel at start, which runs it into the ids
    linkpassd owns (a lab host whose zebra started after linkpassd took
    nexthop 1000100 while linkpassd was recreating it: EEXIST, rail 0 left
    on its backup)."""
    return f"no zebra nexthop kernel enable\nip import-table {config.announce.table}\n"


def bgpd_config(config: Config, *, router_id: str | None = None,
                advertisement_interval_s: int = 0, connect_retry_s: int | None = None) -> str:
    """bgpd's part. Needs `[announce] local_asn`; without `peer_asn` each
    session takes any external AS (leaves of different rails in different ASes).
    `connect_retry_s`: a `timers connect` per session (None: FRR's default,
    120 s, so a session that went down may wait that long to try again)."""
    a = config.announce
    if not a.local_asn:
        raise SnippetError(f"{config.source}: [announce] local_asn must be set to write the FRR "
                           "config")
    remote = str(a.peer_asn) if a.peer_asn else "external"  # a leaf per rail, each its own AS
    out = []
    out += [f"ip prefix-list lp-announce seq {5 * (k + 1)} permit {r.address}/32"
            for k, r in enumerate(config.rails)]
    out.append("!")
    for r in config.rails:
        out += [f"ip prefix-list {_name('own', r.name)} seq 5 permit {r.address}/32"]
    out += ["!", "route-map lp-announce-redistribute permit 10",
            " match ip address prefix-list lp-announce", "!"]
    for r in config.rails:
        metric = metric_of(config, a, r.name)
        name = _name("out", r.name)
        out += [f"route-map {name} permit 10",
                f" match ip address prefix-list {_name('own', r.name)}",
                f" match metric {metric}",
                f" set metric {a.owner_med}",
                f"route-map {name} permit 20",
                " match ip address prefix-list lp-announce",
                f" match metric {metric}",
                " set metric 0",
                f"route-map {name} permit 30",
                " match ip address prefix-list lp-announce",
                f" match metric {settle_metric_of(config, a, r.name)}",
                " set metric 0",
                f" set community {a.settle_community}",
                f"route-map {name} deny 100", "!"]
    out += [f"router bgp {a.local_asn}"]
    out += [f" bgp router-id {router_id or config.rails[0].address}"]
    for r in config.rails:
        out += [f" neighbor {r.gateway} remote-as {remote}",
                f" neighbor {r.gateway} description linkpass {r.name} ({r.port})",
                f" neighbor {r.gateway} update-source {r.address}",
                f" neighbor {r.gateway} advertisement-interval {advertisement_interval_s}"]
        if connect_retry_s is not None:
            out.append(f" neighbor {r.gateway} timers connect {int(connect_retry_s)}")
    out += [" !", " address-family ipv4 unicast",
            f"  redistribute table {a.table} route-map lp-announce-redistribute"]
    for r in config.rails:
        out += [f"  neighbor {r.gateway} route-map {_name('out', r.name)} out"]
    out += [" exit-address-family", "!"]
    return "\n".join(out) + "\n"


def snippet(config: Config) -> str:
    return ("! zebra (zebra.conf or frr.conf)\n" + zebra_config(config) + "!\n"
            "! bgpd (bgpd.conf or frr.conf)\n" + bgpd_config(config))


def main(argv: Sequence[str] | None = None) -> int:
    from linkpassd.config import ConfigError, load_config

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m linkpassd.announce_frr CONFIG", file=sys.stderr)
        return 2
    try:
        config = load_config(args[0])
        if not config.announce.enabled:
            raise SnippetError(f"{config.source}: [announce] is not enabled")
        sys.stdout.write(snippet(config))
    except (ConfigError, SnippetError, OSError) as exc:
        print(f"linkpassd.announce_frr: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
