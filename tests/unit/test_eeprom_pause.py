"""Module EEPROM reads hold RTNL: they wait while a port is failing, so they
never delay the route writes that move its traffic (core.health.eeprom_paused)."""

from linkpassd.core import health
from linkpassd.core.model import LinkSample, Timers, Verdict

UP = LinkSample(port="eth0", present=True, ifindex=2, admin_up=True, carrier=True, operstate="UP")
DOWN = LinkSample(port="eth0", present=True, ifindex=2, admin_up=True, carrier=False,
                  operstate="LOWERLAYERDOWN")


def test_a_healthy_settled_port_is_read():
    state = health.initial(UP, 0.0)
    assert health.eeprom_paused(state, 10.0) is None
    assert health.eeprom_paused(None, 10.0) is None  # no sample yet: nothing to protect


def test_no_reads_on_a_port_without_link_nor_just_after_its_verdict_changed():
    state = health.initial(UP, 0.0)
    down = health.observe(state, DOWN, 10.0, Timers())
    assert down.verdict is Verdict.DOWN
    assert health.eeprom_paused(down, 10.1) == "link down"
    back = health.observe(down, UP, 11.0, Timers(rise=1, hold_down_s=0.0))
    assert back.verdict is Verdict.UP and back.since == 11.0
    assert health.eeprom_paused(back, 11.5) == "verdict just changed"
    assert health.eeprom_paused(back, 11.0 + health.EEPROM_QUIET_S) is None


def test_no_reads_while_a_port_is_failing():
    state = health.initial(UP, 0.0)
    failing = health.observe(state, DOWN, 10.0, Timers(fall=3))
    assert failing.phase == "FAILING"
    assert health.eeprom_paused(failing, 10.1) in ("link down", "port failing")
