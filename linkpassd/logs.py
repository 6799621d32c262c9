"""Structured logs: one event per line, logfmt or JSON, to stderr (journald).

Two things make these lines queryable by an SRE without knowing linkpass:

- `kv` is real logfmt (structlog's LogfmtRenderer: `key=value`, a value
  quoted and escaped when it holds a space, `=` or `"`), so Loki, `lnav`,
  `hl` or any go-logfmt parser splits it. structlog leaves a value holding a
  control character but no space unquoted (a newline becomes a bare `\\n`
  that parsers read as backslash-n; a tab splits the pair): those values are
  quoted and escaped here, the go-logfmt way, so every value round-trips.
- Under journald each line starts with the sd-daemon priority prefix
  (sd-daemon(3): `<3>` err, `<4>` warning, `<6>` info, `<7>` debug), which
  journald strips and records as PRIORITY, so `journalctl -p err -u linkpassd`
  lists the failed reconciles and refused writes and nothing else. Whether
  stderr is the journal is decided by systemd's documented rule (systemd.exec(5),
  `$JOURNAL_STREAM`): the variable holds `<device>:<inode>` of the stream
  journald connected, and it counts only when stderr is still that stream
  (a `2>file` redirect in a wrapper keeps the variable but not the stream).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import Any, TextIO

import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}

# sd-daemon(3) priorities, keyed by structlog's level names (add_log_level
# already maps `warn` to warning and `exception` to error).
SYSLOG_PRIORITY = {"critical": 2, "error": 3, "warning": 4, "info": 6, "debug": 7}
DEFAULT_PRIORITY = 6  # `notice`/`log` levels structlog may pass: journald's default

# What an SRE reads first; the rest follow sorted so lines of one event line up.
KEY_ORDER = ("timestamp", "level", "event")

# Characters structlog's renderer leaves bare although they break a line or a
# pair: C0 controls and DEL (go-logfmt quotes these), plus C1 controls and the
# Unicode line/paragraph separators, which line readers such as Python's
# str.splitlines() split on. Inside quotes they become escapes.
_NEEDS_OUR_QUOTING = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_SHORT_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_TO_ESCAPE = re.compile('[\x00-\x1f\x7f-\x9f\u2028\u2029"\\\\]')


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _SHORT_ESCAPES.get(char) or f"\\u{ord(char):04x}"


class LogfmtRenderer:
    """structlog's LogfmtRenderer for each pair, with `KEY_ORDER` first, and
    go-logfmt quoting for the values structlog would leave bare although they
    hold a control character. True/False render as `true`/`false` (not a bare
    flag), so a query like `drained=true` works the same for both."""

    def __init__(self) -> None:
        self._pair = structlog.processors.LogfmtRenderer(bool_as_flag=False)

    def __call__(self, logger: Any, method_name: str, event_dict: dict[str, Any]) -> str:
        keys = [k for k in KEY_ORDER if k in event_dict]
        keys += sorted(k for k in event_dict if k not in KEY_ORDER)
        return " ".join(self._render(logger, method_name, k, event_dict[k]) for k in keys)

    def _render(self, logger: Any, method_name: str, key: str, value: Any) -> str:
        if value is not None and not isinstance(value, bool):
            text = str(value)
            if _NEEDS_OUR_QUOTING.search(text):
                return f'{key}="{_TO_ESCAPE.sub(_escape, text)}"'
        return self._pair(logger, method_name, {key: value})


def stream_is_journal(stream: TextIO, journal_stream: str | None) -> bool:
    """systemd.exec(5): `$JOURNAL_STREAM` is `<st_dev>:<st_ino>` (decimal) of the
    stream journald connected; stderr is the journal when its fstat matches.
    Anything malformed or unstattable means no: a plain line is always safe."""
    if not journal_stream:
        return False
    dev, sep, ino = journal_stream.partition(":")
    if not sep or not dev.isdigit() or not ino.isdigit():
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):  # closed, or not a real file (pytest capture)
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


class JournalPriority:
    """Prefix the rendered line with `<N>`, N from the event's level."""

    def __init__(self, renderer: Any) -> None:
        self._renderer = renderer

    def __call__(self, logger: Any, method_name: str, event_dict: dict[str, Any]) -> str:
        priority = SYSLOG_PRIORITY.get(str(event_dict.get("level", "")), DEFAULT_PRIORITY)
        return f"<{priority}>{self._renderer(logger, method_name, event_dict)}"


def renderer(fmt: str, journal: bool) -> Any:
    if fmt not in ("kv", "json"):
        raise ValueError(f"log format {fmt!r}: expected 'kv' or 'json'")
    # JSONRenderer already falls back to repr() for what json cannot encode.
    base = structlog.processors.JSONRenderer() if fmt == "json" else LogfmtRenderer()
    return JournalPriority(base) if journal else base


def configure(fmt: str = "kv", level: str = "info", *, stream: TextIO | None = None,
              journal: bool | None = None) -> None:
    """Set up structlog for this process. `stream` defaults to stderr; `journal`
    (whether to add the priority prefix) defaults to systemd's rule for it."""
    if level not in LEVELS:
        raise ValueError(f"log level {level!r}: expected one of {', '.join(LEVELS)}")
    out = sys.stderr if stream is None else stream
    if journal is None:
        journal = stream_is_journal(out, os.environ.get("JOURNAL_STREAM"))
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer(fmt, journal),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
