"""The aggregator's config (aggregator/settings.py) and its entry point
(aggregator/main.py): every bad key or value named with its file, the
--check-config and start-up exit statuses, and a real process serving under a
fake systemd notify socket until SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agg_tls import REPO, make_pki
from linkpassd.aggregator import main as agg_main
from linkpassd.aggregator.settings import Settings, load_settings, parse_settings
from linkpassd.config.checks import ConfigError

SRC = "/etc/linkpass/aggregator.toml"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("agg-pki"))


def good_toml(pki: Path, db: Path) -> str:
    return (f'[aggregator]\nlisten = "127.0.0.1:7443"\ndatabase = "{db}"\nretention_days = 7\n'
            f'restart_cost_min = 45\nheartbeat_s = 2.5\nmax_message_bytes = 1048576\n'
            f'[tls]\nca = "{pki}/ca.pem"\ncert = "{pki}/agg.pem"\nkey = "{pki}/agg-key.pem"\n'
            f'[mesh]\npeers_per_rail = 4\nmax_peers_per_rail = 6\n[web]\nlisten = ""\n'
            f'[metrics]\nlisten = "127.0.0.1:9481"\n[validation]\nhost_budget_pps = 2500\n')


def test_a_full_config_becomes_settings(pki: Path, tmp_path: Path) -> None:
    path = tmp_path / "aggregator.toml"
    path.write_text(good_toml(pki, tmp_path / "fleet.db"))
    s = load_settings(path)
    assert (s.listen, s.retention_days, s.restart_cost_min, s.heartbeat_s) == ("127.0.0.1:7443", 7, 45.0, 2.5)
    assert (s.max_message_bytes, s.peers_per_rail, s.max_peers_per_rail) == (1048576, 4, 6)
    assert (s.web_listen, s.metrics_listen, s.tls.insecure) == ("", "127.0.0.1:9481", False)
    assert s.tls.cert == f"{pki}/agg.pem"
    assert s.validation_host_budget_pps == 2500.0


def test_defaults_need_only_tls_or_insecure() -> None:
    s = parse_settings("[tls]\ninsecure = true\n", SRC)
    assert s == Settings(source=SRC, tls=s.tls) and s.tls.insecure
    assert s.listen == "0.0.0.0:7443" and s.web_listen == "127.0.0.1:9480" and s.metrics_listen == ""


@pytest.mark.parametrize("text, key, says", [
    ("[aggregator]\nlisten = 7443\n[tls]\ninsecure = true", "aggregator.listen", "expected a string, got integer 7443"),
    ('[aggregator]\nlisten = "7443"\n[tls]\ninsecure = true', "aggregator.listen", "expected HOST:PORT"),
    ('[aggregator]\nlisten = "::1:7443"\n[tls]\ninsecure = true', "aggregator.listen", "needs brackets"),
    ('[aggregator]\nlisten = "0.0.0.0:70000"\n[tls]\ninsecure = true', "aggregator.listen", "'70000'"),
    ("[aggregator]\nretention_days = 0\n[tls]\ninsecure = true", "aggregator.retention_days", "0 is outside 1..3650"),
    ("[aggregator]\nretention_days = true\n[tls]\ninsecure = true", "aggregator.retention_days", "got boolean true"),
    ("[aggregator]\nheartbeat_s = nan\n[tls]\ninsecure = true", "aggregator.heartbeat_s", "got nan"),
    ("[aggregator]\nmax_message_bytes = 10\n[tls]\ninsecure = true", "aggregator.max_message_bytes", "10 is outside"),
    ('[aggregator]\nlog_level = "loud"\n[tls]\ninsecure = true', "aggregator.log_level", "one of debug"),
    ('[aggregator]\ndatabase = ""\n[tls]\ninsecure = true', "aggregator.database", "must not be empty"),
    ("[aggregator]\nlisen = 1\n[tls]\ninsecure = true", "aggregator.lisen", "unknown key; did you mean 'listen'?"),
    ("[tls]\ninsecure = 1", "tls.insecure", "expected true or false, got integer 1"),
    ('[tls]\ninsecure = true\nca = "/x/ca.pem"', "tls.insecure", "together with tls.ca"),
    ('[tls]\nca = "/x/ca.pem"\ncert = "/x/c.pem"', "tls.key", "missing"),
    ("", "tls.ca", "missing: mTLS needs"),
    ("[mesh]\npeers_per_rail = 5\nmax_peers_per_rail = 4\n[tls]\ninsecure = true", "mesh.max_peers_per_rail",
     "at least mesh.peers_per_rail (5)"),
    ('[web]\nlisten = "0.0.0.0:7443"\n[tls]\ninsecure = true', "web.listen", "same address as aggregator.listen"),
    ("[validation]\nhost_budget_pps = 10\n[tls]\ninsecure = true", "validation.host_budget_pps",
     "10.0 is outside 100..1e+07"),
    ("[webs]\nlisten = 1", "webs", "unknown section"),
    ("aggregator = 3", "aggregator", "expected a table [aggregator], got integer 3"),
])
def test_every_bad_key_or_value_is_named_with_the_file(text: str, key: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_settings(text + "\n", SRC)
    assert err.value.key == key
    message = str(err.value)
    assert message.startswith(f"{SRC}: {key}") and says in message, message


def test_tls_files_are_read_at_check_time(pki: Path, tmp_path: Path) -> None:
    base = good_toml(pki, tmp_path / "fleet.db")
    path = tmp_path / "a.toml"
    path.write_text(base.replace(f"{pki}/ca.pem", f"{pki}/nope.pem"))
    with pytest.raises(ConfigError, match=r"tls\.ca: '.*nope\.pem' does not exist"):
        load_settings(path)
    path.write_text(base.replace(f"{pki}/agg-key.pem", f"{pki}/h1-key.pem"))  # another cert's key
    with pytest.raises(ConfigError, match=r"tls\.cert: .*not a PEM certificate and its matching key"):
        load_settings(path)
    path.write_text(base.replace(str(tmp_path / "fleet.db"), str(tmp_path / "no" / "fleet.db")))
    with pytest.raises(ConfigError, match=r"aggregator\.database: .* its directory does not exist"):
        load_settings(path)


def test_check_config_and_start_exit_statuses(pki: Path, tmp_path: Path, capsys) -> None:
    good = tmp_path / "good.toml"
    good.write_text(good_toml(pki, tmp_path / "fleet.db"))
    assert agg_main.main(["--config", str(good), "--check-config"]) == 0
    assert "OK: " in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text('[aggregator]\nheartbeat_s = "5"\n[tls]\ninsecure = true\n')
    assert agg_main.main(["--config", str(bad), "--check-config"]) == 1
    assert capsys.readouterr().err.strip() == f"{bad}: aggregator.heartbeat_s: expected a number, got string '5'"
    assert agg_main.main(["--config", str(bad)]) == 2  # the unit's RestartPreventExitStatus
    assert "aggregator.heartbeat_s" in capsys.readouterr().err


def test_the_process_serves_notifies_systemd_and_stops_on_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "aggregator.toml"
    config.write_text(f'[aggregator]\nlisten = "127.0.0.1:0"\ndatabase = "{tmp_path}/fleet.db"\n'
                      f'[tls]\ninsecure = true\n[web]\nlisten = "127.0.0.1:0"\n')
    notify_path = str(tmp_path / "notify.sock")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    notify.settimeout(30)
    env = {**os.environ, "NOTIFY_SOCKET": notify_path, "WATCHDOG_USEC": "400000", "PYTHONPATH": str(REPO)}
    env.pop("WATCHDOG_PID", None)
    proc = subprocess.Popen([sys.executable, "-m", "linkpassd.aggregator.main", "--config", str(config)],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert notify.recv(4096).startswith(b"READY=1")
        assert notify.recv(4096) == b"WATCHDOG=1"  # pinged from the loop, every 0.2 s
        lines = []
        while not any("event=serving" in line for line in lines):
            line = proc.stderr.readline()
            assert line, f"linkpass-aggregator ended before serving: {''.join(lines)}"
            lines.append(line)
        text = "".join(lines)
        assert "level=warning" in text and "INSECURE_MODE" in text and "NO TLS" in text
        serving = next(line for line in lines if "event=serving" in line)
        port = int(re.search(r"\bport=(\d+)", serving).group(1))
        web = re.search(r"\bweb=([\d.]+:\d+)", serving).group(1)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            got = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service="linkpass.v1.FleetService"), timeout=20)
            assert got.status == health_pb2.HealthCheckResponse.SERVING
        with urllib.request.urlopen(f"http://{web}/", timeout=20) as page:
            body = page.read().decode()
            assert page.status == 200 and "<html" in body.lower()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        seen = b""
        deadline = time.monotonic() + 30
        while b"STOPPING=1" not in seen and time.monotonic() < deadline:
            seen += notify.recv(4096)
        assert b"STOPPING=1" in seen
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stderr.close()
        notify.close()


def test_listen_takes_an_absolute_unix_socket_and_refuses_a_relative_one(tmp_path) -> None:
    from linkpassd.config.checks import check_unix_listen

    assert check_unix_listen("unix:/run/linkpass/agg.sock") == "unix:/run/linkpass/agg.sock"
    with pytest.raises(ValueError, match="absolute path"):
        check_unix_listen("unix:agg.sock")
    with pytest.raises(ValueError, match="longer than"):
        check_unix_listen("unix:/" + "x" * 120)


def test_the_store_is_sqlite_by_default_or_postgresql_with_a_dsn(tmp_path) -> None:
    s = parse_settings("[tls]\ninsecure = true\n", SRC)
    assert (s.store, s.postgresql_dsn) == ("sqlite", "")
    dsn = "postgresql://linkpass@/fleet?host=/run/postgresql"
    s = parse_settings(f'[aggregator]\nstore = "postgresql"\npostgresql_dsn = "{dsn}"\n[tls]\ninsecure = true\n', SRC)
    assert (s.store, s.postgresql_dsn) == ("postgresql", dsn)
    # `database` is the SQLite file: a PostgreSQL config does not check its directory
    path = tmp_path / "pg.toml"
    path.write_text(f'[aggregator]\nstore = "postgresql"\npostgresql_dsn = "{dsn}"\n'
                    f'database = "{tmp_path}/no/such/dir/fleet.db"\n[tls]\ninsecure = true\n')
    assert load_settings(path).store == "postgresql"
    assert agg_main.store_label(load_settings(path)) == f"store postgresql {dsn}"


@pytest.mark.parametrize("text, key, says", [
    ('store = "mysql"', "aggregator.store", "'mysql' is not one of sqlite, postgresql"),
    ('store = "postgresql"', "aggregator.postgresql_dsn", 'missing: store = "postgresql" needs postgresql_dsn'),
    ('postgresql_dsn = "postgresql://db/fleet"', "aggregator.postgresql_dsn", 'given, but store is "sqlite"'),
    ('store = "postgresql"\npostgresql_dsn = "mysql://db/fleet"', "aggregator.postgresql_dsn",
     "expected a postgresql:// URL"),
    ('store = "postgresql"\npostgresql_dsn = "db.example:5432"', "aggregator.postgresql_dsn",
     "expected a postgresql:// URL"),
    ('store = "postgresql"\npostgresql_dsn = "postgresql://db:99999/fleet"', "aggregator.postgresql_dsn",
     "not a postgresql:// URL"),
    ('store = "postgresql"\npostgresql_dsn = 5432', "aggregator.postgresql_dsn", "expected a string, got integer 5432"),
])
def test_a_bad_store_selection_is_named(text: str, key: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_settings(f"[aggregator]\n{text}\n[tls]\ninsecure = true\n", SRC)
    assert err.value.key == key
    assert str(err.value).startswith(f"{SRC}: {key}") and says in str(err.value), str(err.value)


def test_a_bad_dsn_is_shown_without_its_password() -> None:
    with pytest.raises(ConfigError) as err:
        parse_settings('[aggregator]\nstore = "postgresql"\n'
                       'postgresql_dsn = "postgresql://agg:hunter2@db:99999/fleet"\n[tls]\ninsecure = true\n', SRC)
    assert "hunter2" not in str(err.value) and "agg:***@db:99999" in str(err.value)
    with pytest.raises(ConfigError) as err:  # a control character is named, the password is not
        parse_settings('[aggregator]\nstore = "postgresql"\n'
                       'postgresql_dsn = "postgresql://agg:hunter2@db/fle\\tet"\n[tls]\ninsecure = true\n',
                       SRC)
    assert err.value.key == "aggregator.postgresql_dsn"
    assert "hunter2" not in str(err.value) and "control character" in str(err.value), str(err.value)
    s = parse_settings('[aggregator]\nstore = "postgresql"\npostgresql_dsn = "postgresql://agg:hunter2@db/fleet"\n'
                       '[tls]\ninsecure = true\n', SRC)
    assert agg_main.store_label(s) == "store postgresql postgresql://agg:***@db/fleet"


def test_serve_opens_a_postgresql_store_when_selected(pg_cluster, pg_databases) -> None:
    """main builds PgStore for store = "postgresql": while it serves, its
    connections are on that database and the schema is there; a database it
    cannot reach is exit status 1 (store unusable)."""
    import asyncio

    from linkpassd.aggregator.pg_schema import SCHEMA_VERSION

    dsn = pg_databases()
    database = dsn.split("/")[3].split("?")[0]

    def settings_for(url: str) -> Settings:
        return parse_settings(f'[aggregator]\nlisten = "127.0.0.1:0"\nstore = "postgresql"\n'
                              f'postgresql_dsn = "{url}"\n[tls]\ninsecure = true\n[web]\nlisten = ""\n', SRC)

    def ours_on_it() -> str:
        return pg_cluster.psql("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND application_name = 'linkpass-aggregator'", database=database).strip()

    async def scenario() -> int:
        stop = asyncio.Event()
        served = asyncio.create_task(agg_main.serve(settings_for(dsn), stop=stop))
        def migrated() -> bool:
            try:
                stored = pg_cluster.psql("SELECT version FROM linkpass_schema", database=database)
                return stored.strip() == str(SCHEMA_VERSION)
            except subprocess.CalledProcessError:  # no such table yet
                return False

        deadline = time.monotonic() + 60
        while not (await asyncio.to_thread(migrated) and await asyncio.to_thread(ours_on_it) != "0"):
            assert time.monotonic() < deadline and not served.done(), "the server never opened its store"
            await asyncio.sleep(0.05)
        stop.set()
        return await asyncio.wait_for(served, 60)

    assert asyncio.run(scenario()) == 0
    deadline = time.monotonic() + 60
    while ours_on_it() != "0":  # closed at stop (the server notices a moment later)
        assert time.monotonic() < deadline, "the store's connections outlived the server"
        time.sleep(0.05)
    unreachable = dsn.replace(str(pg_cluster.workdir), "/nonexistent")
    assert asyncio.run(agg_main.serve(settings_for(unreachable))) == 1


# --------------------------------------------------------------------------
# the option table: one declaration drives validation, defaults and the reference
# --------------------------------------------------------------------------

AGG_DOCS = REPO / "docs" / "aggregator-config.md"


def test_committed_aggregator_reference_matches_the_option_table() -> None:
    from linkpassd.config.reference import render_aggregator_reference

    assert AGG_DOCS.read_text(encoding="utf-8") == render_aggregator_reference(), (
        "docs/aggregator-config.md is stale: run `.venv/bin/python -m linkpassd.config "
        "--reference aggregator > docs/aggregator-config.md`")


def test_the_reference_command_prints_the_aggregator_reference() -> None:
    proc = subprocess.run([sys.executable, "-m", "linkpassd.config", "--reference", "aggregator"],
                          capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == AGG_DOCS.read_text(encoding="utf-8")
    bad = subprocess.run([sys.executable, "-m", "linkpassd.config", "--reference", "aggregatr"],
                         capture_output=True, text=True, timeout=60, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert bad.returncode == 2 and "usage:" in bad.stderr


def test_every_option_has_help_and_a_reference_row_and_is_a_settings_default() -> None:
    """Each option of the table is documented and is what Settings() holds
    when the file leaves it out: the dataclass has no defaults of its own."""
    from linkpassd.aggregator.settings import TlsSettings
    from linkpassd.config.aggregator_schema import AGGREGATOR_SCHEMA
    from linkpassd.config.reference import render_aggregator_reference

    doc = render_aggregator_reference()
    field_of = {("web", "listen"): "web_listen", ("metrics", "listen"): "metrics_listen",
                ("validation", "host_budget_pps"): "validation_host_budget_pps",
                ("fence", "leaf_cap"): "fence_leaf_cap"}
    defaults, tls = Settings(), TlsSettings()
    for section in AGGREGATOR_SCHEMA:
        section_doc = doc.split(f"## `{section.header}`")[1].split("\n## ")[0]
        for option in section.options:
            assert option.help and f"| `{option.key}` |" in section_doc, (section.name, option.key)
            holder = tls if section.name == "tls" else defaults
            name = option.key if section.name in ("aggregator", "tls", "mesh") \
                else field_of[section.name, option.key]
            assert getattr(holder, name) == option.default, (section.name, option.key)


def test_an_option_key_in_the_wrong_section_says_where_it_belongs() -> None:
    with pytest.raises(ConfigError) as err:
        parse_settings('[aggregator]\ninsecure = true\n', SRC)
    assert err.value.key == "aggregator.insecure"
    assert "it belongs in [tls]" in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse_settings('peers_per_rail = 3\n[tls]\ninsecure = true\n', SRC)
    assert err.value.key == "peers_per_rail" and "belongs in [mesh]" in str(err.value)


def test_the_example_config_loads_as_the_defaults() -> None:
    """examples/aggregator.toml, insecure instead of its certificates (which
    do not exist here), is the option table's defaults."""
    example = (REPO / "examples" / "aggregator.toml").read_text()
    text = "\n".join(line for line in example.splitlines()
                     if not line.startswith(("ca =", "cert =", "key =")))
    text = text.replace("# insecure = true", "insecure = true")
    s = parse_settings(text, "examples/aggregator.toml")
    assert s == Settings(source="examples/aggregator.toml", tls=s.tls) and s.tls.insecure


@pytest.mark.parametrize("program", ["linkpassd", "linkpass-aggregator"])
def test_both_daemons_take_config_and_check_config_through_one_helper(program, tmp_path,
                                                                        capsys) -> None:
    """The same forms, the same refusal of two files, the same --help text for
    both programs (config.cli)."""
    from linkpassd.daemon import cli as daemon

    if program == "linkpassd":
        main = daemon.main
        config = tmp_path / "linkpassd.toml"
        config.write_text('[daemon]\ncontrol_socket = "%s/s.sock"\n[[rail]]\nname = "r0"\n'
                          'port = "eth0"\naddress = "198.18.0.1/24"\ngateway = "198.18.0.254"\n'
                          % tmp_path)
    else:
        main = agg_main.main
        config = tmp_path / "aggregator.toml"
        config.write_text(f'[aggregator]\nlisten = "127.0.0.1:0"\ndatabase = "{tmp_path}/f.db"\n'
                          '[tls]\ninsecure = true\n')
    for argv in (["--check-config", str(config)], ["--config", str(config), "--check-config"],
                 ["--check-config", str(config), "--config", str(config)]):
        assert main(argv) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.startswith(f"OK: {config}: ")
    with pytest.raises(SystemExit) as exit_:
        main(["--config", str(config), "--check-config", str(tmp_path / "other.toml")])
    assert exit_.value.code == 2 and "name two files" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--check-config [FILE]" in help_text
    assert "check the config (FILE, or the --config file)" in help_text
    assert "without touching the system; print OK or the problem, then exit" in help_text
