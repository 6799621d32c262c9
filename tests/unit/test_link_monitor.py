"""Link events as the monitor reads them: a watched port renamed away is
gone from the port's side (issue 28: it kept showing PRESENT)."""

from __future__ import annotations

from linkpassd.adapters.links import IFF_LOWER_UP, IFF_UP, LinkMonitor


def newlink(name: str, index: int, up: bool = True) -> dict:
    return {"event": "RTM_NEWLINK", "index": index, "ifname": name,
            "flags": (IFF_UP | IFF_LOWER_UP) if up else 0, "IFLA_OPERSTATE": "UP" if up else "DOWN"}


async def _ignore(item) -> None:  # pragma: no cover - not called: no run()
    pass


def monitor_seeing(*present: tuple[str, int]) -> LinkMonitor:
    monitor = LinkMonitor(["eth0", "eth1"], _ignore)
    for name, index in present:
        monitor.samples_of(newlink(name, index))
    return monitor


def test_a_watched_port_renamed_away_is_reported_missing() -> None:
    monitor = monitor_seeing(("eth0", 2), ("eth1", 3))
    samples = monitor.samples_of(newlink("spare7", 3))  # ip link set eth1 name spare7
    assert [(s.port, s.present) for s in samples] == [("eth1", False)]
    assert monitor.samples_of(newlink("spare7", 3)) == []  # said once
    back = monitor.samples_of(newlink("eth1", 3))  # and renamed back
    assert [(s.port, s.present, s.carrier) for s in back] == [("eth1", True, True)]


def test_an_unwatched_link_or_a_changed_watched_one_reports_only_itself() -> None:
    monitor = monitor_seeing(("eth0", 2), ("eth1", 3))
    assert monitor.samples_of(newlink("lo", 1)) == []
    down = monitor.samples_of(newlink("eth1", 3, up=False))
    assert [(s.port, s.present, s.carrier) for s in down] == [("eth1", True, False)]


def test_a_deleted_port_is_missing_and_its_index_forgotten() -> None:
    monitor = monitor_seeing(("eth1", 3))
    gone = monitor.samples_of({"event": "RTM_DELLINK", "index": 3, "ifname": "eth1"})
    assert [(s.port, s.present) for s in gone] == [("eth1", False)]
    assert monitor.samples_of(newlink("other", 3)) == []  # ifindex reused: not eth1's news
