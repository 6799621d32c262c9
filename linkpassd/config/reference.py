"""The config reference (docs/config.md), generated from the schema, and
`linkpassd --check-config`.

Regenerate the docs after changing the schema:

    .venv/bin/python -m linkpassd.config --reference > docs/config.md
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Sequence
from typing import Any

from linkpassd.config.build import load_config
from linkpassd.config.checks import DEFAULT_PATH, ConfigError, _count, _one_line
from linkpassd.config.schema import SCHEMA

# --------------------------------------------------------------------------
# Reference documentation
# --------------------------------------------------------------------------


def _toml_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_literal(v) for v in value) + "]"
    return repr(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_reference_markdown() -> str:
    """The config reference, generated from SCHEMA (committed as docs/config.md)."""
    out = [
        "# linkpassd configuration reference",
        "",
        "<!-- Generated from SCHEMA in linkpassd/config/schema.py; do not edit by hand. Regenerate with",
        "     .venv/bin/python -m linkpassd.config --reference > docs/config.md -->",
        "",
        f"linkpassd reads one TOML file, by default `{DEFAULT_PATH}`. Every section is optional "
        "except at least one `[[rail]]`; options left out take the default shown. Unknown "
        "sections and keys, wrong types and impossible values are errors: linkpassd refuses to "
        "start on a bad file, and a SIGHUP reload of one keeps the running config.",
        "",
        "Check a file without touching the system: `linkpassd --check-config FILE` (or "
        "`linkpassd --config FILE --check-config`). Errors are "
        "one line, `<file>: <key path>: <reason>`, with key paths such as "
        "`ownership.table_min`, `rail[1].gateway` or `rail[0].backups[1]` (arrays count from 0). "
        "With `[aggregator]` (not insecure) it also reads the client certificate and checks "
        "that it names `host_id` as the aggregator requires, naming both when they differ.",
        "",
        "IPv4 only for now. A complete example is `examples/linkpassd.toml`.",
    ]
    for section in SCHEMA:
        out += ["", f"## `{section.header}`", "", section.help, ""]
        if section.switch:
            out += [f"Optional: without a `{section.header}` section the feature is off; with "
                    "one, its required keys must be set.", ""]
        out += ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
        for opt in section.options:
            if opt.required:
                default = "**required**"
            elif opt.default_doc:
                default = opt.default_doc
            else:
                default = f"`{_toml_literal(opt.default)}`"
            allowed = "; ".join(c.doc for c in opt.checks) or "—"
            out.append(
                f"| `{opt.key}` | {opt.type.name} | {_cell(default)} | {_cell(allowed)} | {_cell(opt.help)} |"
            )
        if section.rules:
            out += ["", "Also checked:", ""]
            out += [f"- {rule}" for rule in section.rules]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------
# linkpassd --check-config
# --------------------------------------------------------------------------


def control_socket_problem(socket_path: str) -> str | None:
    """What on this machine would stop linkpassd from making its control
    socket (None: nothing): an existing ancestor of the socket that is not a
    directory, or the socket's own path taken by something that is not a
    socket. Read-only; `--check-config` and the daemon's start both ask."""
    path = os.path.abspath(socket_path)
    parent = os.path.dirname(path)
    ancestor = parent
    while True:
        try:
            st = os.stat(ancestor)
        except (FileNotFoundError, NotADirectoryError):  # look further up for what is in the way
            ancestor = os.path.dirname(ancestor)
            continue
        except OSError as exc:
            return f"{socket_path!r}: cannot check {ancestor}: {exc.strerror}"
        if not stat.S_ISDIR(st.st_mode):
            return (f"{socket_path!r}: {ancestor} is not a directory (it is a "
                    f"{'regular file' if stat.S_ISREG(st.st_mode) else 'non-directory'}), "
                    "so the control socket cannot be made under it")
        break
    if ancestor == parent:
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISSOCK(st.st_mode):
            return f"{socket_path!r} exists and is not a socket; linkpassd will not remove it"
    return None


def check_config_main(path: str | os.PathLike[str]) -> int:
    """`linkpassd --check-config FILE`: 0 and an OK line, or 1 and the one-line error
    on stderr. Never a traceback: it runs in config pipelines. Beyond the file
    itself: [aggregator]'s host_id against its client certificate
    (agent.certcheck), which the aggregator would refuse: 3 and that line, as
    the file itself is valid and linkpassd would run and protect the host."""
    try:
        config = load_config(path)
        socket_problem = control_socket_problem(config.control_socket)
        if socket_problem:
            raise ConfigError(config.source, "daemon.control_socket", socket_problem)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    from linkpassd.agent.certcheck import host_id_problem  # grpc and X.509: only when checking
    problem = host_id_problem(config.aggregator)
    if problem is not None:
        print(f"{_one_line(config.source)}: {problem}", file=sys.stderr)
        return 3
    print(
        f"OK: {_one_line(config.source)}: {_count(len(config.rails), 'rail')}, "
        f"{_count(len(config.multipath), 'multipath group')}"
    )
    return 0


def _main(argv: Sequence[str]) -> int:
    if list(argv) == ["--reference"]:
        sys.stdout.write(render_reference_markdown())
        return 0
    if len(argv) == 1 and not argv[0].startswith("-"):
        return check_config_main(argv[0])
    print("usage: python -m linkpassd.config (--reference | FILE)", file=sys.stderr)
    return 2

