"""[fence] in linkpassd's config: defaults (off), and every bad value refused
with an error naming the option and the value."""

from __future__ import annotations

import pytest

from linkpassd.config import ConfigError, parse_config
from linkpassd.core.model import FenceSettings
from test_config import BASE, edit

PROBED = edit("[probes]\nenabled = false", "[probes]\nenabled = true")


def with_fence(body: str, base: str = PROBED) -> str:
    return base + "\n[fence]\n" + body + "\n"


def test_off_by_default_and_the_documented_defaults():
    cfg = parse_config(BASE)
    assert cfg.fence == FenceSettings()
    assert cfg.fence.enabled is False and cfg.fence.require_leaf_grant is True
    on = parse_config(with_fence("enabled = true\nfence_after_s = 2.5\nmax_fenced = 2"))
    assert on.fence.enabled and on.fence.fence_after_s == 2.5 and on.fence.max_fenced == 2


@pytest.mark.parametrize("body, key, words", [
    ("fence_after_s = 0.1", "fence.fence_after_s", "0.1"),
    ("fence_after_s = \"5s\"", "fence.fence_after_s", "5s"),
    ("max_fenced = 0", "fence.max_fenced", "0"),
    ("backoff_initial_s = 700.0", "fence.backoff_initial_s", "700 is more than backoff_max_s (600)"),
    ("test_window_s = 20.0", "fence.test_window_s", "20 must be less than test_timeout_s (15)"),
    ("test_timeout_s = 40.0\nbackoff_initial_s = 30.0", "fence.test_timeout_s",
     "40 must be less than backoff_initial_s (30)"),
    ("lift_hold_s = -1.0", "fence.lift_hold_s", "-1"),
    ("enable = true", "fence.enable", "enable"),
    ("require_leaf_grant = \"no\"", "fence.require_leaf_grant", "no"),
])
def test_bad_values_are_named(body, key, words):
    with pytest.raises(ConfigError) as err:
        parse_config(with_fence(body))
    text = str(err.value)
    assert key in text and words in text, text


def test_fencing_needs_a_probe_on_every_rail():
    with pytest.raises(ConfigError) as err:
        parse_config(with_fence("enabled = true", base=BASE))
    text = str(err.value)
    assert "fence.enabled" in text and "rail0, rail1" in text and "[probes]" in text
    # BFD on every rail is a probe too
    bfd = edit('backups = ["rail1"]', 'backups = ["rail1"]\nbfd = true',
               'backups = ["rail0"]', 'backups = ["rail0"]\nbfd = true')
    assert parse_config(with_fence("enabled = true", base=bfd)).fence.enabled
    # off: no probe needed
    assert not parse_config(with_fence("enabled = false", base=BASE)).fence.enabled


def test_a_test_too_short_for_bfd_to_come_back_is_refused():
    """A fenced port comes up for its test with its BFD session down, and
    BFD needs up to 2 s at its slow-start rate to be Up again: a test that
    leaves less than that beyond its window fails on a healthy port."""
    bfd = PROBED.replace('backups = ["rail1"]', 'backups = ["rail1"]\nbfd = true', 1)  # rail0
    assert bfd != PROBED
    short = "enabled = true\ntest_window_s = 1.0\ntest_timeout_s = 2.0\nbackoff_initial_s = 3.0"
    with pytest.raises(ConfigError) as err:
        parse_config(with_fence(short, base=bfd))
    text = str(err.value)
    assert "fence.test_timeout_s" in text and "rail(s) rail0 " in text, text
    assert "at least test_window_s + 2" in text, text
    ok = short.replace("test_timeout_s = 2.0", "test_timeout_s = 3.0").replace(
        "backoff_initial_s = 3.0", "backoff_initial_s = 4.0")
    assert parse_config(with_fence(ok, base=bfd)).fence.test_timeout_s == 3.0
    # without BFD (echo only) the short test is allowed; fencing off checks nothing
    assert parse_config(with_fence(short)).fence.enabled
    assert not parse_config(with_fence(short.replace("enabled = true", "enabled = false"),
                                       base=bfd)).fence.enabled
