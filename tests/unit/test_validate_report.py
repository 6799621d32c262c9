"""The validation report (linkpassd/validate/report.py): terminal text with
findings first, JSON that round-trips, a PNG heatmap, and the exit code rule."""

import json

import pytest

from linkpassd.exitcodes import ExitCode
from linkpassd.validate import report
from linkpassd.validate.localize import localize
from linkpassd.validate.results import HostResult
from validatefixtures import Fabric


def make_report(fabric, *, missing=()):
    results = fabric.results()
    analysis = localize(fabric.plan, results)
    hosts = [HostResult(h, "ok", v) for h, v in results.items() if h not in missing]
    hosts += [HostResult(h, "timed out") for h in missing]
    return report.build_report("val-test", hosts, analysis.findings, analysis.loss_resolution,
                               started_s=1_700_000_000.0, finished_s=1_700_000_031.5)


def faulty():
    fabric = Fabric()
    fabric.blackholed_ports.add(("gpu-06", "rail0"))
    fabric.lossy[("gpu-04", "rail1")] = 0.02
    return fabric


def test_terminal_text_lists_findings_first_then_the_rails():
    text = report.render_text(make_report(faulty()))
    lines = text.splitlines()
    assert lines[0] == "validation val-test: 8 hosts, 8 answered, 31.5 s"
    first = lines.index("FINDINGS (2):")
    rails = lines.index("per rail:")
    assert first < rails
    assert lines[first + 1].startswith("  1. blackhole [rail0]: gpu-06 eth0 <-> leaf-r0-b Ethernet2")
    assert "confidence 9" in lines[first + 1]
    assert any(line.startswith("  2. lossy_link [rail1]: gpu-04 eth1") for line in lines[first:rails])
    rail0 = next(line for line in lines if line.startswith("  rail0:"))
    assert "8 ports checked, 20 pairs probed, 5 failing" in rail0
    assert lines[-1] == "2 finding(s): not ready to hand over"
    assert "loss resolution: random loss >= 0.252% per host port" in text


def test_terminal_text_of_a_healthy_run_says_so_and_names_hosts_without_result():
    text = report.render_text(make_report(Fabric()))
    assert "FINDINGS" not in text
    assert text.splitlines()[-1] == "no finding: every checked port, cable and path is as planned"
    silent = report.render_text(make_report(Fabric(), missing=("gpu-02",)))
    assert "hosts without a result: gpu-02 (timed out)" in silent
    assert silent.splitlines()[-1] == "0 finding(s): not ready to hand over"


def test_terminal_text_lists_a_hosts_notes_and_a_note_alone_passes():
    import dataclasses

    fabric = Fabric()
    results = fabric.results()
    note = "burst phase: sent 5470 of 5688 probes in 3.2 s (this host could not keep up)"
    results["gpu-03"] = dataclasses.replace(results["gpu-03"], notes=(note,))
    analysis = localize(fabric.plan, results)
    made = report.build_report("val-test", [HostResult(h, "ok", v) for h, v in results.items()],
                               analysis.findings, analysis.loss_resolution)
    text = report.render_text(made)
    assert f"  gpu-03: {note}" in text
    assert report.exit_code(made) == ExitCode.OK
    assert text.splitlines()[-1] == "no finding: every checked port, cable and path is as planned"


def test_json_is_the_report_message_and_round_trips():
    original = make_report(faulty())
    text = report.to_json(original)
    document = json.loads(text)
    assert document["run_id"] == "val-test"
    assert document["findings"][0]["kind"] == "blackhole"
    assert "loss_resolution" in document and "burst_sent" in text  # proto field names, not camelCase
    assert report.from_json(text) == original


def test_json_that_is_not_a_report_is_refused_naming_the_source():
    with pytest.raises(ValueError, match="last.json: not a ValidationReport"):
        report.from_json('{"findings": 3}', "last.json")


def test_exit_code_rule():
    assert report.exit_code(make_report(Fabric())) == ExitCode.OK == 0
    assert report.exit_code(make_report(faulty())) == ExitCode.FINDINGS
    # No finding, but a host that did not answer was not proven.
    assert report.exit_code(make_report(Fabric(), missing=("gpu-05",))) == ExitCode.FINDINGS


def test_png_is_written(tmp_path):
    fabric = faulty()
    out = report.write_png(make_report(fabric, missing=("gpu-08",)), tmp_path / "validate.png", fabric.plan)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000


def test_heatmap_data():
    fabric = faulty()
    r = make_report(fabric, missing=("gpu-08",))
    hosts, rails, grid = report.host_rail_status(r)
    assert rails == ["rail0", "rail1"]
    assert grid[hosts.index("gpu-06")] == [1, 0]
    assert grid[hosts.index("gpu-04")] == [0, 1]
    assert grid[hosts.index("gpu-08")] == [2, 2]
    assert grid[hosts.index("gpu-01")] == [0, 0]
    leaves, loss = report.leaf_loss(r, "rail1", fabric.plan)
    assert leaves == ["leaf-r1-a", "leaf-r1-b"]
    assert loss[1][1] == 0.0 and loss[0][0] > 0.0  # gpu-04 is under leaf-r1-a
    # Without the plan, the leaves come from LLDP; a host that sent nothing is under "?".
    assert report.leaf_loss(r, "rail1")[0] == ["?", *leaves]
    assert report.leaf_loss(make_report(fabric), "rail1")[0] == leaves
