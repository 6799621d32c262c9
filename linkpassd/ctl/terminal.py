"""What linkpassctl writes to a terminal: text from hosts, daemons and the
aggregator (port names, messages, evidence, paths, error details) with every
control character made visible.

A host certificate, or a local user who can name a port, must not be able to
write into an operator's terminal: ESC and the other C0 controls start
sequences that retitle the window, clear the screen, move the cursor or (in
some terminals) answer back as if typed; the C1 controls (U+0080-U+009F) do
the same in 8-bit form; bidirectional overrides and zero-width characters
reorder or hide what is shown. Each of them is printed as its escape
(`\\x1b`, `\\u202e`), so what the operator reads is what was sent.

`echo` is the one way linkpassctl prints (tests/unit/test_ctl_terminal.py
checks that no other module calls click.echo); `safe(text, one_line=True)`
also escapes newlines and tabs, for a field inside a line or a table cell.
JSON output needs neither: json.dumps escapes every control character.
"""

from __future__ import annotations

import re

import click

# C0 but newline and tab, DEL, C1, and the format characters that reorder or
# hide text (Arabic letter mark, zero-width, line/paragraph separators, bidi
# embeddings/overrides/isolates, word joiner and invisible operators, BOM,
# interlinear annotation).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb]")
_UNSAFE_IN_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: str, *, one_line: bool = False) -> str:
    """`text` with control characters escaped; one_line: newlines and tabs too."""
    return (_UNSAFE_IN_LINE if one_line else _UNSAFE).sub(_escape, text)


def echo(text: str, *, err: bool = False) -> None:
    """click.echo of `text` made safe for a terminal (newlines and tabs kept)."""
    click.echo(safe(text), err=err)
