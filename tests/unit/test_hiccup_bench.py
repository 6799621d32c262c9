"""The hiccup bench's pure parts: fault names, the trial schedule, echo
options into the daemon's config, and the aggregation of trial rows."""

from __future__ import annotations

import json
import random
import tomllib

import pytest

import labs.bench.hiccup as hiccup
from labs.bench.hiccup import (
    FAULTS,
    FaultSpec,
    fault_spec,
    parse_echo_opts,
    schedule,
    summarise,
    table,
)
from labs.topos.plan import with_section_options


def test_fault_names_parse_to_kind_and_size():
    assert fault_spec("outage-20") == FaultSpec("outage-20", "outage", 20.0)
    assert fault_spec("pause-100") == FaultSpec("pause-100", "pause", 100.0)
    assert fault_spec("busy-all").kind == "load"
    assert fault_spec("blackhole").must_move and not fault_spec("outage-80").must_move
    assert all(fault_spec(name).name == name for name in FAULTS)


@pytest.mark.parametrize("bad", ["outage-0", "pause-501", "outage", "outage-x", "busy", ""])
def test_bad_fault_names_are_named(bad):
    with pytest.raises(ValueError, match=repr(bad)):
        fault_spec(bad)


def test_schedule_runs_every_fault_once_per_round_at_a_phase_within_one_interval():
    faults = [fault_spec(f) for f in ("outage-5", "pause-10", "blackhole")]
    plan = schedule(faults, 4, 50, random.Random(7))
    assert len(plan) == 12
    for index in range(4):
        round_ = plan[index * 3:(index + 1) * 3]
        assert {t.index for t in round_} == {index}
        assert sorted(t.fault.name for t in round_) == sorted(f.name for f in faults)
    assert all(0 <= t.phase_s < 0.050 for t in plan)
    assert len({t.phase_s for t in plan}) == 12  # drawn, not fixed
    # shuffled: not every round in the given order
    assert any([t.fault.name for t in plan[i * 3:i * 3 + 3]] != [f.name for f in faults]
               for i in range(4))
    assert plan == schedule(faults, 4, 50, random.Random(7))  # the seed reproduces it
    with pytest.raises(ValueError):
        schedule(faults, 0, 50, random.Random(1))


def test_echo_opts_are_toml_values():
    assert parse_echo_opts(["tolerance_ms=30", "x=2.5", "on=true", 'name="a b"', "w=word"]) == {
        "tolerance_ms": 30, "x": 2.5, "on": True, "name": "a b", "w": "word"}
    for bad in ["tolerance_ms", "=3", "a b=1", "k="]:
        with pytest.raises(ValueError, match="--echo-opt"):
            parse_echo_opts([bad])


def test_section_options_replace_add_or_append_the_table():
    text = "[daemon]\nx = 1\n[probes]\nenabled = true\ninterval_ms = 50\n[[rail]]\nname = \"r0\"\n"
    out = tomllib.loads(with_section_options(text, "probes", {"interval_ms": 10,
                                                              "tolerance_ms": 30}))
    assert out["probes"] == {"enabled": True, "interval_ms": 10, "tolerance_ms": 30}
    assert out["rail"] == [{"name": "r0"}] and out["daemon"] == {"x": 1}
    out = tomllib.loads(with_section_options(text, "echo", {"tolerance_ms": 30}))
    assert out["echo"] == {"tolerance_ms": 30} and out["probes"]["interval_ms"] == 50
    assert with_section_options(text, "echo", {}) == text


def _row(mech, fault, trial, moved=None, blackout=None, lost=0, error=None):
    if error:
        return {"mechanism": mech, "fault": fault, "trial": trial, "error": error}
    moves = {"lph1": moved, "lph2": None}
    return {"mechanism": mech, "fault": fault, "trial": trial, "moves": moves,
            "moved": moved is not None,
            "move_after_ms": moved["after_ms"] if moved else None,
            "blackout_ms": blackout, "lost": lost}


def test_summary_counts_moves_blackouts_and_errors_per_cell():
    rows = [
        _row("linkpassd-10", "outage-20", 0, moved={"after_ms": 18.0}),
        _row("linkpassd-10", "outage-20", 1),
        _row("linkpassd-10", "outage-20", 2, moved={"after_ms": 30.0}),
        _row("linkpassd-10", "outage-20", 3, error="TimeoutError: x"),
        _row("bfd-10", "outage-20", 0),
        _row("bfd-10", "blackhole", 0, moved={"after_ms": 95.0}, blackout=100.0),
        _row("bfd-10", "blackhole", 1, moved={"after_ms": 90.0}, blackout=120.0),
        _row("bfd-10", "blackhole", 2, moved={"after_ms": 91.0}, blackout=101.0),
    ]
    s = summarise(rows)
    c = s["linkpassd-10|outage-20"]
    assert (c["trials"], c["errors"], c["moved"]) == (3, 1, 2)
    assert c["moved_fraction"] == pytest.approx(2 / 3)
    assert c["moved_trials"] == [0, 2] and c["moved_by_host"] == {"lph1": 2, "lph2": 0}
    assert c["move_after_ms"] == {"median_ms": 24.0, "min_ms": 18.0, "max_ms": 30.0, "n": 2}
    assert c["blackout_ms"] is None
    assert s["bfd-10|outage-20"]["moved_fraction"] == 0
    b = s["bfd-10|blackhole"]
    assert b["blackout_ms"] == {"median_ms": 101.0, "min_ms": 100.0, "max_ms": 120.0, "n": 3}
    assert b["kind"] == "blackhole" and b["size_ms"] == 1000
    text = table(s, ["linkpassd-10", "bfd-10"], ["outage-20", "blackhole"])
    assert "2/3 e1" in text and "3/3 101ms" in text and "0/1" in text


def test_fences_are_counted_per_cell_when_fencing_was_on():
    rows = [{**_row("linkpassd-10", "outage-20", 0), "fences": {"lph1": 0, "lph2": 0}},
            {**_row("linkpassd-10", "blackhole", 0, moved={"after_ms": 80.0}, blackout=90.0),
             "fences": {"lph1": 1, "lph2": 0}},
            {**_row("linkpassd-10", "blackhole", 1, moved={"after_ms": 80.0}, blackout=90.0),
             "fences": {"lph1": 1, "lph2": 1}}]
    s = summarise(rows)
    assert s["linkpassd-10|outage-20"]["fenced"] == 0
    assert s["linkpassd-10|blackhole"]["fenced"] == 3
    text = table(s, ["linkpassd-10"], ["outage-20", "blackhole"])
    assert "0/1 f0" in text and "2/2 90ms f3" in text
    # without fencing no count at all (not a zero that was never measured)
    assert "fenced" not in summarise([_row("bfd-10", "outage-20", 0)])["bfd-10|outage-20"]


def _part(results, label, faults, rows, trials=10, opts=None):
    doc = {"bench": "hiccup", "label": label, "trials_per_cell": trials, "seed": 1,
           "mechanisms": {"linkpassd-10": {"kind": "linkpassd", "interval_ms": 10},
                          "bfd-10": {"kind": "frr-bgp", "interval_ms": 10}},
           "echo_section": "probes", "echo_opts": opts or {},
           "faults": [{"name": f} for f in faults], "elapsed_s": 60.0,
           "loadavg": {"start": [1, 1, 1], "end": [2, 2, 2]}, "summary": {}, "rows": rows}
    (results / f"hiccup-{label}.json").write_text(json.dumps(doc))


def test_runs_in_parts_merge_into_one_result(tmp_path, monkeypatch):
    monkeypatch.setattr(hiccup, "RESULTS", tmp_path)
    monkeypatch.setattr(hiccup, "plot", lambda *a, **k: (tmp_path / "drawn").write_text("x"))
    _part(tmp_path, "a", ["blackhole"], [_row("bfd-10", "blackhole", 0, {"after_ms": 90.0}, 100.0)])
    _part(tmp_path, "b", ["outage-20"], [_row("linkpassd-10", "outage-20", 0),
                                         _row("bfd-10", "outage-20", 0, {"after_ms": 40.0})])
    assert hiccup.main(["--merge", "a,b", "--label", "ab"]) == 0
    out = json.loads((tmp_path / "hiccup-ab.json").read_text())
    assert [f["name"] for f in out["faults"]] == ["outage-20", "blackhole"]  # the grid's order
    assert out["summary"]["bfd-10|outage-20"]["moved"] == 1
    assert out["summary"]["bfd-10|blackhole"]["blackout_ms"]["median_ms"] == 100.0
    assert [p["label"] for p in out["parts"]] == ["a", "b"] and out["elapsed_s"] == 120.0
    assert (tmp_path / "drawn").exists()


@pytest.mark.parametrize("second, why", [
    ({"faults": ["blackhole"]}, "fault blackhole is in two parts"),
    ({"faults": ["outage-20"], "trials": 5}, "trials_per_cell 5 differs"),
    ({"faults": ["outage-20"], "opts": {"tolerance_ms": 50}}, "echo_opts"),
])
def test_parts_that_do_not_belong_together_are_refused_by_name(tmp_path, monkeypatch, capsys,
                                                                second, why):
    monkeypatch.setattr(hiccup, "RESULTS", tmp_path)
    _part(tmp_path, "a", ["blackhole"], [])
    _part(tmp_path, "b", second["faults"], [], second.get("trials", 10), second.get("opts"))
    with pytest.raises(SystemExit):
        hiccup.main(["--merge", "a,b", "--label", "ab"])
    assert why in capsys.readouterr().err
    assert not (tmp_path / "hiccup-ab.json").exists()


def test_a_missing_part_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(hiccup, "RESULTS", tmp_path)
    with pytest.raises(SystemExit):
        hiccup.main(["--merge", "nope", "--label", "x"])
    assert "hiccup-nope.json" in capsys.readouterr().err
