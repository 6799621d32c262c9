"""`--config FILE` and `--check-config [FILE]`, taken the same way by both
daemons (linkpassd and linkpass-aggregator): one helper adds the options to a
program's parser and says which file to use and whether only to check it.

    --config FILE                  run with FILE (default: the program's own path)
    --check-config FILE            check FILE and exit
    --config FILE --check-config   the same
    --check-config                 check the default file and exit

`--config A --check-config B` names two files: a usage error, never a guess.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigChoice:
    path: str  # the config file to use
    check_only: bool  # --check-config: check it and exit


def add_config_options(parser: argparse.ArgumentParser, *, default_path: str,
                       checks: str) -> None:
    """Add --config and --check-config to `parser`; `checks` says what the
    check covers beyond the file itself (for --help)."""
    parser.add_argument("--config", metavar="FILE", default=None,
                        help=f"the config file (TOML) [default: {default_path}]")
    parser.add_argument("--check-config", metavar="FILE", nargs="?", const=True, default=None,
                        help=f"check the config (FILE, or the --config file){checks}, without "
                             "touching the system; print OK or the problem, then exit")


def config_choice(parser: argparse.ArgumentParser, args: argparse.Namespace, *,
                  default_path: str) -> ConfigChoice:
    """The file and mode `args` (parsed by a parser given add_config_options) ask for.
    Two different files is a usage error (parser.error: exit status 2)."""
    path = args.config or default_path
    if args.check_config is None:
        return ConfigChoice(path, check_only=False)
    if isinstance(args.check_config, str):
        if args.config is not None and args.config != args.check_config:
            parser.error(f"--config {args.config} and --check-config {args.check_config} "
                         "name two files; give the file once")
        path = args.check_config
    return ConfigChoice(path, check_only=True)
