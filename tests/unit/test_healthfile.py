"""adapters.healthfile: health.json written atomically, readable by anyone, marked stopped."""

import json
import os
import stat
import threading

import pytest

from linkpassd.adapters import healthfile as healthfile_module
from linkpassd.adapters import statefile
from linkpassd.adapters.healthfile import HealthFile, HealthFileError
from linkpassd.core import healthdoc
from tests.unit.corefixtures import ports, rails_config

RDMA = {"eth0": ("mlx5_0", 1)}


def make_doc(generation=1, written_at=1000.0):
    config = rails_config(2)
    return healthdoc.build("gpu17", "boot-1", generation, written_at, 5.0, 4242, config.rails,
                           ports(config), RDMA)


def test_write_then_read_gives_the_same_document(tmp_path):
    hf = HealthFile(str(tmp_path / "health.json"))
    doc = make_doc()
    hf.write(doc)
    assert hf.read() == doc
    assert json.loads((tmp_path / "health.json").read_text()) == healthdoc.to_json(doc)


def test_file_is_0644_and_a_missing_directory_is_made_0755_whatever_the_umask(tmp_path):
    path = tmp_path / "run" / "linkpass" / "health.json"
    old = os.umask(0o077)
    try:
        HealthFile(str(path)).write(make_doc())
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755


def test_an_existing_directory_keeps_its_mode(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o750)
    os.chmod(run, 0o750)
    HealthFile(str(run / "health.json")).write(make_doc())
    assert stat.S_IMODE(run.stat().st_mode) == 0o750


def test_rewrite_replaces_the_file_by_rename_so_an_open_reader_keeps_a_whole_old_document(tmp_path):
    path = tmp_path / "health.json"
    hf = HealthFile(str(path))
    hf.write(make_doc(generation=1))
    with open(path) as reader:  # a launcher that opened the file just before the rewrite
        old_inode = os.fstat(reader.fileno()).st_ino
        hf.write(make_doc(generation=2))
        assert json.load(reader)["generation"] == 1  # still the complete old document
    assert path.stat().st_ino != old_inode
    assert hf.read().generation == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["health.json"]  # no temp file left


def test_a_failed_write_leaves_the_previous_document_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "health.json"
    hf = HealthFile(str(path))
    hf.write(make_doc(generation=1))

    def fail_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(statefile.os, "replace", fail_replace)
    with pytest.raises(OSError, match="No space left"):
        hf.write(make_doc(generation=2))
    monkeypatch.undo()
    assert hf.read().generation == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["health.json"]


def test_a_reader_racing_many_rewrites_always_parses_a_whole_document(tmp_path):
    path = tmp_path / "health.json"
    hf = HealthFile(str(path))
    hf.write(make_doc(generation=1))
    done = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def reader():
        while not done.is_set():
            try:
                seen.append(hf.read().generation)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for generation in range(2, 42):
            hf.write(make_doc(generation=generation))
    finally:
        done.set()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert errors == []
    assert seen == sorted(seen) and set(seen) <= set(range(1, 42))
    assert hf.read().generation == 41


def test_mark_stopped_rewrites_the_document_already_stale(tmp_path):
    hf = HealthFile(str(tmp_path / "health.json"))
    doc = make_doc(generation=7, written_at=1000.0)
    hf.write(doc)
    final = hf.mark_stopped(doc, now=1001.5)
    back = hf.read()
    assert back == final
    assert (back.written_at, back.valid_until, back.generation) == (1001.5, 1001.5, 8)
    assert back.ports == doc.ports
    why = healthdoc.staleness(back, now=1001.5, pid_alive=True)
    assert why is not None and "stopped" in why


def test_mark_stopped_defaults_to_the_wall_clock(tmp_path, monkeypatch):
    monkeypatch.setattr(healthfile_module.time, "time", lambda: 2000.0)
    hf = HealthFile(str(tmp_path / "health.json"))
    assert hf.mark_stopped(make_doc()).valid_until == 2000.0


def test_write_into_an_unwritable_place_raises_oserror_for_the_caller(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(OSError):
        HealthFile(str(blocker / "health.json")).write(make_doc())


@pytest.mark.parametrize("content, named", [
    (None, "no such file"),
    (b"{\"format\": 1, \"hostn", "not JSON"),
    (b"[]", "expected a JSON object"),
    (b"{\"format\": 1}", "ports: missing"),
])
def test_read_names_the_file_and_what_is_wrong(tmp_path, content, named):
    path = tmp_path / "health.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(HealthFileError) as err:
        HealthFile(str(path)).read()
    assert str(path) in str(err.value) and named in str(err.value)


def test_path_is_the_string_given_for_problems_and_logs(tmp_path):
    # The daemon puts it in a Problem (a proto string field) and in log lines.
    assert HealthFile(str(tmp_path / "health.json")).path == str(tmp_path / "health.json")
