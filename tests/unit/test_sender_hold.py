"""The lab sender's --hold barrier: several senders launched together start
their schedules together, on one line "go", and a sender never released
sends nothing and says why."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labs.traffic.sender import NotReleased, SenderConfig, run_sender, wait_for_go

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pipe():
    r, w = os.pipe()
    reader, writer = os.fdopen(r, "r"), os.fdopen(w, "w")
    yield reader, writer
    reader.close()
    if not writer.closed:
        writer.close()


def test_go_releases_the_sender(pipe, capsys):
    reader, writer = pipe
    writer.write("go\n")
    writer.flush()
    wait_for_go(lambda: False, reader, max_s=5)
    assert "sender: armed" in capsys.readouterr().err


@pytest.mark.parametrize("feed, needle", [("stop\n", "got 'stop'"), (None, "end of input")])
def test_anything_but_go_refuses_to_send(pipe, feed, needle):
    reader, writer = pipe
    if feed is not None:
        writer.write(feed)
        writer.flush()
    else:
        writer.close()
    with pytest.raises(NotReleased, match=needle):
        wait_for_go(lambda: False, reader, max_s=5)


def test_a_sender_never_released_gives_up_by_itself(pipe):
    reader, _ = pipe
    started = time.monotonic()
    with pytest.raises(NotReleased, match="within 0.2 s"):
        wait_for_go(lambda: False, reader, max_s=0.2)
    assert time.monotonic() - started < 5


def test_a_stop_signal_while_held_ends_the_wait(pipe):
    reader, _ = pipe
    with pytest.raises(NotReleased, match="stopped before"):
        wait_for_go(lambda: True, reader, max_s=5)


@pytest.fixture
def sink():
    """A loopback UDP port that takes the sender's packets."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    yield s.getsockname()[1]
    s.close()


def test_the_schedule_starts_only_after_release(sink):
    released = []
    cfg = SenderConfig(mode="kernel-path", src="127.0.0.1", dst="127.0.0.1", rate=200,
                       duration=0.1, port=sink, sport=0, hold=True)
    report = run_sender(cfg, release=lambda: (time.sleep(0.2), released.append(time.monotonic())))
    assert released and report["started_at"] >= released[0]
    assert report["t_first_send"] >= released[0] and report["sent"] > 0


def test_a_release_that_refuses_sends_nothing(sink):
    def refuse():
        raise NotReleased("no")

    cfg = SenderConfig(mode="kernel-path", src="127.0.0.1", dst="127.0.0.1", rate=200,
                       duration=0.1, port=sink, sport=0, hold=True)
    with pytest.raises(NotReleased):
        run_sender(cfg, release=refuse)


def _cli(tmp_path, sink, stdin: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "labs.traffic.sender", "--mode", "kernel-path",
            "--src", "127.0.0.1", "--dst", "127.0.0.1", "--port", str(sink), "--sport", "0",
            "--rate", "200", "--duration", "0.1", "--report", str(tmp_path / "tx.json"), "--hold"]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60,
                          cwd=ROOT)


def test_cli_hold_then_go_sends_and_reports(tmp_path, sink):
    proc = _cli(tmp_path, sink, "go\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.index("armed") < proc.stderr.index("sending t0=")
    assert json.loads((tmp_path / "tx.json").read_text())["sent"] > 0


def test_cli_hold_without_go_exits_1_with_one_line_and_no_report(tmp_path, sink):
    proc = _cli(tmp_path, sink, "")
    assert proc.returncode == 1
    assert "expected 'go' on stdin, got end of input" in proc.stderr
    assert "sending t0=" not in proc.stderr
    assert not (tmp_path / "tx.json").exists()


def test_releasing_a_sender_that_died_after_arming_fails_with_its_log(tmp_path):
    from labs.scenario import Launched

    log = tmp_path / "tx-kernel-path.log"
    log.write_text("sender: armed\nTraceback: the sender's own last words\n")
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"],
                            stdin=subprocess.PIPE)
    proc.wait(timeout=30)
    with pytest.raises(RuntimeError) as failed:
        Launched(proc, "sender in lph1").release(log)
    text = str(failed.value)
    assert "sender in lph1 exited (code 3)" in text
    assert "the sender's own last words" in text


def test_releasing_a_live_sender_writes_go_and_closes_its_input(tmp_path):
    from labs.scenario import Launched

    proc = subprocess.Popen([sys.executable, "-c", "import sys; print(sys.stdin.read(), end='')"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        Launched(proc, "sender in lph1").release(tmp_path / "unused.log")
        out = proc.stdout.read()  # the child exits once its input is closed
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out == b"go\n"
