"""Log lines as an SRE's tools read them: parsed by a real logfmt parser
(logfmtkv in strict mode, which follows go-logfmt, the reference decoder),
and the journald priority prefix exactly when stderr is the journal."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import logfmtkv
import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

from linkpassd import logs


def emit(fmt: str, level: str = "debug", **kwargs) -> list[str]:
    """Configure logging exactly as the daemon does, but into a buffer."""
    out = io.StringIO()
    logs.configure(fmt, level, stream=out, journal=kwargs.pop("journal", False))
    log = structlog.get_logger()
    getattr(log, kwargs.pop("method", "info"))(kwargs.pop("event", "probe_value"), **kwargs)
    return out.getvalue().splitlines()


def parse(line: str) -> dict:
    return logfmtkv.parse(line, strict=True)


AWKWARD = {
    "spaces": "two words  and more",
    "quotes": 'say "hi"',
    "equals": "a=b=c",
    "newline": "first\nsecond",
    "newline_only": "a\nb",  # no space: structlog alone leaves it bare
    "tab": "a\tb",
    "carriage": "a\rb",
    "backslash": "C:\\dir",
    "backslash_space": "C:\\dir and \\n literally",
    "backslash_newline": "x\\\ny",
    "control": "bell\x07",
    "line_separators": "a\u2028b\x85c",  # str.splitlines() splits on these
    "empty": "",
    "unicode": "µs → 1 °C",
    "traceback": 'Traceback (most recent call last):\n  File "x", line 1\nValueError: bad = "1"',
}


@pytest.mark.parametrize("name", sorted(AWKWARD))
def test_logfmt_values_round_trip(name: str) -> None:
    (line,) = emit("kv", value=AWKWARD[name], port="eth0")
    parsed = parse(line)
    assert parsed["value"] == AWKWARD[name], line
    assert parsed["port"] == "eth0" and parsed["event"] == "probe_value"


def test_non_text_values_render_as_their_text() -> None:
    """An exception or a number is logged as str() of it: a message with a
    newline inside is still one quoted value, numbers and bools stay bare."""
    (line,) = emit("kv", error=OSError(17, "File\nexists"), n=3, ok=False, none=None)
    parsed = parse(line)
    assert parsed["error"] == "[Errno 17] File\nexists"
    assert (parsed["n"], parsed["ok"], parsed["none"]) == ("3", "false", "")


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_text_value_round_trips_on_one_line(value: str) -> None:
    lines = emit("kv", value=value, other="after")
    assert len(lines) == 1, lines
    parsed = parse(lines[0])
    assert parsed["value"] == value and parsed["other"] == "after"


def test_logfmt_line_starts_with_time_level_event_then_sorted_keys() -> None:
    (line,) = emit("kv", method="warning", event="reconcile_failed", zeta=1, alpha=2, drained=True)
    pairs = logfmtkv.parse_pairs(line, strict=True)
    keys = [p.key for p in pairs]
    assert keys == ["timestamp", "level", "event", "alpha", "drained", "zeta"]
    parsed = parse(line)
    assert parsed["level"] == "warning" and parsed["drained"] == "true"  # a value, not a bare flag


def test_json_stays_json() -> None:
    (line,) = emit("json", value=AWKWARD["traceback"])
    assert json.loads(line)["value"] == AWKWARD["traceback"]


def test_bad_format_and_level_are_named() -> None:
    with pytest.raises(ValueError, match="'text'"):
        logs.configure("text", "info", stream=io.StringIO())
    with pytest.raises(ValueError, match="'loud'"):
        logs.configure("kv", "loud", stream=io.StringIO())


def test_level_filter_still_applies() -> None:
    assert emit("kv", level="warning", method="info") == []
    assert len(emit("kv", level="warning", method="error")) == 1


# --------------------------------------------------------------------------
# journald: the real rule, in a real process whose stderr is a file
# --------------------------------------------------------------------------

CHILD = """
import structlog
from linkpassd import logs
logs.configure({fmt!r}, "debug")
log = structlog.get_logger()
log.debug("d_line", port="eth0")
log.info("i_line", port="eth0")
log.warning("w_line", port="eth0")
log.error("reconcile_failed", error="write refused: File exists", port="eth0")
try:
    raise RuntimeError("boom")
except RuntimeError:
    log.exception("x_line")
"""
EXPECTED_PRIORITY = {"d_line": "<7>", "i_line": "<6>", "w_line": "<4>",
                     "reconcile_failed": "<3>", "x_line": "<3>"}


def run_child(tmp_path: Path, fmt: str, journal_stream: str | None) -> list[str]:
    """Run a process whose stderr is a file; JOURNAL_STREAM as given
    ("match" = that file's own device:inode, the way journald sets it)."""
    err = tmp_path / "stderr"
    with err.open("w") as stderr:
        env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
        if journal_stream == "match":
            st = os.fstat(stderr.fileno())
            journal_stream = f"{st.st_dev}:{st.st_ino}"
        if journal_stream is not None:
            env["JOURNAL_STREAM"] = journal_stream
        proc = subprocess.run([sys.executable, "-c", CHILD.format(fmt=fmt)], stderr=stderr,
                              env=env, cwd=Path(__file__).resolve().parents[2], timeout=60)
    assert proc.returncode == 0, err.read_text()
    return err.read_text().splitlines()


def body(line: str, fmt: str) -> dict:
    return json.loads(line) if fmt == "json" else parse(line)


@pytest.mark.parametrize("fmt", ["kv", "json"])
def test_priority_prefix_when_stderr_is_the_journal(tmp_path: Path, fmt: str) -> None:
    lines = run_child(tmp_path, fmt, "match")
    assert len(lines) == len(EXPECTED_PRIORITY), lines
    for line in lines:
        prefix, rest = line[:3], line[3:]
        record = body(rest, fmt)  # what journald keeps after stripping the prefix
        assert prefix == EXPECTED_PRIORITY[record["event"]], line
    failed = next(body(line[3:], fmt) for line in lines if line.startswith("<3>"))
    assert failed["event"] == "reconcile_failed" and failed["port"] == "eth0"


@pytest.mark.parametrize("journal_stream", [None, "", "0:0", "garbage", "12:x", "other-file"])
def test_no_prefix_unless_journal_stream_is_stderr(tmp_path: Path, journal_stream: str | None) -> None:
    if journal_stream == "other-file":  # e.g. a wrapper redirected stderr away from the journal
        st = os.stat(Path(__file__))
        journal_stream = f"{st.st_dev}:{st.st_ino}"
    lines = run_child(tmp_path, "kv", journal_stream)
    assert len(lines) == len(EXPECTED_PRIORITY), lines
    for line in lines:
        assert not line.startswith("<"), line
        assert parse(line)["event"] in EXPECTED_PRIORITY
