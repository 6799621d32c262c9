"""The daemon's event handling without a kernel: what arrives before a port's
first link sample must not be lost."""

from linkpassd.adapters.bfd import BfdEvent, PeerSpec
from linkpassd.core.bfd import State, StateChange
from linkpassd.core.model import LinkSample, Verdict
from linkpassd.daemon import Daemon

from corefixtures import rails_config


def bfd_event(port: str, state: State, ever_up: bool = True) -> BfdEvent:
    change = StateChange(old=State.INIT, new=state, diag=0, at=1.0, remote_state=State.UP,
                         ever_up=ever_up)
    spec = PeerSpec(ifname=port, local="198.18.0.1", peer="198.18.0.254", name="bfd:gw")
    return BfdEvent(name="bfd:gw", spec=spec, change=change, detection_time_s=0.3,
                    since_last_rx_s=0.0, lag_s=0.0, max_lag_s=0.0)


def sample(port: str) -> LinkSample:
    return LinkSample(port=port, present=True, ifindex=2, admin_up=True, carrier=True,
                      operstate="UP")


def test_a_bfd_session_up_before_the_ports_first_sample_is_kept():
    daemon = Daemon(rails_config(2))
    daemon._observe_bfd(bfd_event("eth0", State.UP), 1.0)  # no health for eth0 yet
    assert "eth0" not in daemon.health
    daemon._observe(sample("eth0"), 1.1)
    probes = dict(daemon.health["eth0"].signals.probes)
    assert probes["bfd:gw"].status == "up" and probes["bfd:gw"].effective is Verdict.UP
    assert daemon.early_probes == {}


def test_an_early_event_for_a_port_not_in_the_config_is_ignored():
    daemon = Daemon(rails_config(2))
    daemon._observe_bfd(bfd_event("eth9", State.UP), 1.0)
    assert daemon.early_probes == {}
