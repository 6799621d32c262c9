"""Files an installed linkpass carries with it: the systemd units and complete
example configs of both daemons, so a host installed from a wheel (no checkout)
can still `systemctl enable` a unit and start from a complete config (linkpassd's
passes --check-config as it is; the aggregator's once its certificates exist).

The canonical copies live in the repository's `systemd/` and `examples/`,
where operators and reviewers look; these are installed copies of them, kept
identical by tests/unit/test_packaging.py. Read them with `read_text(name)`
(importlib.resources: works from a wheel, a zip or an editable install).
"""

from __future__ import annotations

from importlib import resources

UNITS = ("linkpassd.service", "linkpass-aggregator.service")
EXAMPLE_CONFIG = "linkpassd.toml"
AGGREGATOR_EXAMPLE_CONFIG = "aggregator.toml"
FILES = (*UNITS, EXAMPLE_CONFIG, AGGREGATOR_EXAMPLE_CONFIG)


def read_text(name: str) -> str:
    """The packaged file `name` (one of FILES)."""
    if name not in FILES:
        raise ValueError(f"no packaged file {name!r}; there are: {', '.join(FILES)}")
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
