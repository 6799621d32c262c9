"""linkpassd configuration: a TOML file in, a validated frozen `Config` out.

Every option is declared once, in `SCHEMA` (config.schema), with its type,
default, help text and checks. The same table drives validation
(config.build) and the reference documentation (config.reference, committed
as `docs/config.md`), so the two cannot disagree. linkpass-aggregator's
options are declared the same way, in config.aggregator_schema (reference:
`docs/aggregator-config.md`), and both daemons take `--config` and
`--check-config` through config.cli.

A bad config must never reach the kernel: the daemon refuses to start on one and
keeps the last good config when a SIGHUP reload brings one.
"""

from linkpassd.config.build import build_config, load_config, parse_config
from linkpassd.config.checks import DEFAULT_PATH, MAX_FILE_BYTES, ConfigError
from linkpassd.config.reference import check_config_main, render_reference_markdown
from linkpassd.config.schema import SCHEMA, Option, Section

__all__ = [
    "DEFAULT_PATH",
    "MAX_FILE_BYTES",
    "SCHEMA",
    "ConfigError",
    "Option",
    "Section",
    "build_config",
    "check_config_main",
    "load_config",
    "parse_config",
    "render_reference_markdown",
]
