"""A help2man include file with a COMMANDS section: each command's own
`--help`, from click (recursing into groups such as `linkpassctl fleet`).

    python man_commands.py linkpassd.ctl.main:cli linkpassctl > commands.h2m
    help2man --include commands.h2m ... linkpassctl
"""

from __future__ import annotations

import importlib
import sys

import click


def roff_literal(text: str) -> list[str]:
    """Lines that roff shows as written: backslashes escaped, and a line
    starting with a dot or a quote kept from being read as a request."""
    out = []
    for line in text.splitlines():
        line = line.replace("\\", "\\e")
        if line.startswith((".", "'")):
            line = "\\&" + line
        out.append(line)
    return out


def sections(group: click.Group, path: list[str], parent: click.Context) -> list[str]:
    out: list[str] = []
    for name in group.list_commands(parent):
        command = group.get_command(parent, name)
        if command is None or command.hidden:
            continue
        ctx = click.Context(command, info_name=name, parent=parent)
        out += [f".SS {' '.join([*path[1:], name])}", ".nf", *roff_literal(command.get_help(ctx)), ".fi"]
        if isinstance(command, click.Group):
            out += sections(command, [*path, name], ctx)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2 or ":" not in argv[0]:
        print("usage: man_commands.py MODULE:GROUP PROGRAM", file=sys.stderr)
        return 2
    module, attr = argv[0].split(":", 1)
    group = getattr(importlib.import_module(module), attr)
    root = click.Context(group, info_name=argv[1], **group.context_settings)
    print("[COMMANDS]")
    print("\n".join(sections(group, [argv[1]], root)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
