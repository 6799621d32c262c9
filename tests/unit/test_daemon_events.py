"""The daemon's event handling without a kernel: what arrives before a port's
first link sample must not be lost, and a BFD Down set aside for our own
lateness is asked again rather than forgotten."""

from corefixtures import rails_config
from linkpassd.adapters.bfd import BfdEvent, PeerSpec
from linkpassd.core.bfd import State, StateChange
from linkpassd.core.model import LinkSample, Verdict
from linkpassd.daemon.loop import Daemon


def bfd_event(port: str, state: State, ever_up: bool = True, *, old: State = State.INIT,
              diag: int = 0, max_lag_s: float = 0.0, recheck: bool = False) -> BfdEvent:
    change = StateChange(old=old, new=state, diag=diag, at=1.0, remote_state=State.UP,
                         ever_up=ever_up)
    spec = PeerSpec(ifname=port, local="198.18.0.1", peer="198.18.0.254", name="bfd:gw")
    return BfdEvent(name="bfd:gw", spec=spec, change=change, detection_time_s=0.3,
                    since_last_rx_s=0.0, lag_s=0.0, max_lag_s=max_lag_s, recheck=recheck)


def sample(port: str) -> LinkSample:
    return LinkSample(port=port, present=True, ifindex=2, admin_up=True, carrier=True,
                      operstate="UP")


def test_a_bfd_session_up_before_the_ports_first_sample_is_kept():
    daemon = Daemon(rails_config(2))
    daemon.observe_bfd(bfd_event("eth0", State.UP), 1.0)  # no health for eth0 yet
    assert "eth0" not in daemon.health
    daemon.observe(sample("eth0"), 1.1)
    probes = dict(daemon.health["eth0"].signals.probes)
    assert probes["bfd:gw"].status == "up" and probes["bfd:gw"].effective is Verdict.UP
    assert daemon.early_probes == {}


def test_an_early_event_for_a_port_not_in_the_config_is_ignored():
    daemon = Daemon(rails_config(2))
    daemon.observe_bfd(bfd_event("eth9", State.UP), 1.0)
    assert daemon.early_probes == {}


class RecordingBfd:
    """Stands in for BfdAgent: records what the daemon asks it to recheck."""

    def __init__(self):
        self.rechecks: list[tuple[str, float | None]] = []

    def recheck(self, name: str, detection_s: float | None) -> None:
        self.rechecks.append((name, detection_s))


def bfd_judged(daemon: Daemon, port: str = "eth0"):
    return dict(daemon.health[port].signals.probes)["bfd:gw"]


def up_daemon_with_bfd() -> tuple[Daemon, RecordingBfd]:
    daemon = Daemon(rails_config(2))
    daemon.probes.bfd = agent = RecordingBfd()
    daemon.observe(sample("eth0"), 1.0)
    daemon.observe_bfd(bfd_event("eth0", State.UP), 1.1)
    assert daemon.health["eth0"].verdict is Verdict.UP
    return daemon, agent


def bfd_messages(daemon: Daemon) -> list[str]:
    """What the daemon has said (or would say once its batch is written) about BFD."""
    return [pending[7] for pending in daemon.recorder.pending if pending[1] == "bfd_session"]


def test_a_down_our_stall_explains_is_set_aside_and_asked_again():
    daemon, agent = up_daemon_with_bfd()
    daemon.observe_bfd(bfd_event("eth0", State.DOWN, old=State.UP, diag=1, max_lag_s=0.2), 2.0)
    assert bfd_judged(daemon).status == "suspect"
    assert daemon.health["eth0"].verdict is Verdict.UP
    assert agent.rechecks == [("bfd:gw", 0.3)]


def test_a_down_that_holds_once_the_loop_kept_time_fails_the_port():
    daemon, agent = up_daemon_with_bfd()
    daemon.observe_bfd(bfd_event("eth0", State.DOWN, old=State.UP, diag=1, max_lag_s=0.2), 2.0)
    daemon.observe_bfd(bfd_event("eth0", State.DOWN, old=State.DOWN, diag=1, max_lag_s=0.01,
                                  recheck=True), 3.3)
    assert bfd_judged(daemon).status == "down"
    assert daemon.health["eth0"].verdict is Verdict.DOWN
    assert agent.rechecks == [("bfd:gw", 0.3)]  # answered: not asked again
    assert bfd_messages(daemon)[-1] == \
        "BFD bfd:gw on eth0: still down once our loop kept time (control detection time expired)"


def test_a_recheck_while_the_loop_is_still_late_asks_again_and_says_nothing():
    daemon, agent = up_daemon_with_bfd()
    daemon.observe_bfd(bfd_event("eth0", State.DOWN, old=State.UP, diag=1, max_lag_s=0.2), 2.0)
    said = bfd_messages(daemon)
    daemon.observe_bfd(bfd_event("eth0", State.DOWN, old=State.DOWN, diag=1, max_lag_s=0.2,
                                  recheck=True), 3.3)
    assert bfd_judged(daemon).status == "suspect"
    assert daemon.health["eth0"].verdict is Verdict.UP
    assert agent.rechecks == [("bfd:gw", 0.3)] * 2
    assert bfd_messages(daemon) == said


def test_a_down_counted_at_once_is_not_asked_again():
    daemon, agent = up_daemon_with_bfd()
    daemon.observe_bfd(bfd_event("eth0", State.DOWN, old=State.UP, diag=1, max_lag_s=0.01), 2.0)
    assert bfd_judged(daemon).status == "down" and agent.rechecks == []
