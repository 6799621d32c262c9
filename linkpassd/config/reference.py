"""The config references, generated from the option tables (linkpassd's
docs/config.md, linkpass-aggregator's docs/aggregator-config.md), and
`linkpassd --check-config`.

Regenerate the docs after changing a table:

    .venv/bin/python -m linkpassd.config --reference > docs/config.md
    .venv/bin/python -m linkpassd.config --reference aggregator > docs/aggregator-config.md
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Sequence
from typing import Any

from linkpassd.config.aggregator_schema import AGGREGATOR_DEFAULT_PATH, AGGREGATOR_SCHEMA
from linkpassd.config.build import load_config
from linkpassd.config.checks import DEFAULT_PATH, ConfigError, _count, _one_line
from linkpassd.config.schema import SCHEMA, Section

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
    """linkpassd's config reference, generated from SCHEMA (committed as docs/config.md)."""
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
    return "\n".join(out + _sections_markdown(SCHEMA)) + "\n"


def render_aggregator_reference() -> str:
    """linkpass-aggregator's config reference, generated from AGGREGATOR_SCHEMA
    (committed as docs/aggregator-config.md)."""
    out = [
        "# linkpass-aggregator configuration reference",
        "",
        "<!-- Generated from AGGREGATOR_SCHEMA in linkpassd/config/aggregator_schema.py; do not edit",
        "     by hand. Regenerate with",
        "     .venv/bin/python -m linkpassd.config --reference aggregator > docs/aggregator-config.md -->",
        "",
        f"linkpass-aggregator reads one TOML file, by default `{AGGREGATOR_DEFAULT_PATH}`. Every "
        "section is optional, but `[tls]` must either name the certificates or say "
        "`insecure = true`; options left out take the default shown. Unknown sections and keys, "
        "wrong types and impossible values are errors: the aggregator refuses to start on a bad "
        "file (exit status 2, which the unit's `RestartPreventExitStatus=` keeps from looping).",
        "",
        "Check a file: `linkpass-aggregator --check-config FILE` (or `linkpass-aggregator "
        "--config FILE --check-config`): it also reads the TLS files (the CA parses, the "
        "certificate matches its key) and, with SQLite, that the database's directory exists; "
        "it does not connect to a PostgreSQL database. Errors are one line, "
        "`<file>: <key path>: <reason>`, naming the value (a database URL without its "
        "password).",
        "",
        "How to run it, certificates, replicas and sizing: docs/aggregator.md. A complete "
        "example is `examples/aggregator.toml`.",
    ]
    return "\n".join(out + _sections_markdown(AGGREGATOR_SCHEMA)) + "\n"


def _sections_markdown(schema: tuple[Section, ...]) -> list[str]:
    """One heading, the help and a table of options per section."""
    out: list[str] = []
    for section in schema:
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
    return out


REFERENCES = {"daemon": render_reference_markdown, "aggregator": render_aggregator_reference}


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
    (config.certcheck), which the aggregator would refuse: 3 and that line, as
    the file itself is valid and linkpassd would run and protect the host."""
    try:
        config = load_config(path)
        socket_problem = control_socket_problem(config.control_socket)
        if socket_problem:
            raise ConfigError(config.source, "daemon.control_socket", socket_problem)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    from linkpassd.config.certcheck import host_id_problem  # X.509: only when checking
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
    args = list(argv)
    if args[:1] == ["--reference"] and len(args) <= 2:
        which = args[1] if len(args) == 2 else "daemon"
        if which in REFERENCES:
            sys.stdout.write(REFERENCES[which]())
            return 0
    if len(args) == 1 and not args[0].startswith("-"):
        return check_config_main(args[0])
    print("usage: python -m linkpassd.config (--reference [daemon | aggregator] | FILE)",
          file=sys.stderr)
    return 2
