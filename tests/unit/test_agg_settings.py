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
    ("[aggregator]\nlisten = 7443\n[tls]\ninsecure = true", "aggregator.listen", "= 7443: expected a string"),
    ('[aggregator]\nlisten = "7443"\n[tls]\ninsecure = true', "aggregator.listen", "expected HOST:PORT"),
    ('[aggregator]\nlisten = "::1:7443"\n[tls]\ninsecure = true', "aggregator.listen", "needs brackets"),
    ('[aggregator]\nlisten = "0.0.0.0:70000"\n[tls]\ninsecure = true', "aggregator.listen", "'70000'"),
    ("[aggregator]\nretention_days = 0\n[tls]\ninsecure = true", "aggregator.retention_days", "= 0: expected"),
    ("[aggregator]\nretention_days = true\n[tls]\ninsecure = true", "aggregator.retention_days", "= True"),
    ("[aggregator]\nheartbeat_s = nan\n[tls]\ninsecure = true", "aggregator.heartbeat_s", "= nan"),
    ("[aggregator]\nmax_message_bytes = 10\n[tls]\ninsecure = true", "aggregator.max_message_bytes", "= 10"),
    ('[aggregator]\nlog_level = "loud"\n[tls]\ninsecure = true', "aggregator.log_level", "one of debug"),
    ('[aggregator]\ndatabase = ""\n[tls]\ninsecure = true', "aggregator.database", "not empty"),
    ("[aggregator]\nlisen = 1\n[tls]\ninsecure = true", "aggregator.lisen", "unknown key; [aggregator] takes listen"),
    ("[tls]\ninsecure = 1", "tls.insecure", "= 1: expected true or false"),
    ('[tls]\ninsecure = true\nca = "/x/ca.pem"', "tls.insecure", "together with tls.ca"),
    ('[tls]\nca = "/x/ca.pem"\ncert = "/x/c.pem"', "tls.key", "missing"),
    ("", "tls.ca", "missing: mTLS needs"),
    ("[mesh]\npeers_per_rail = 5\nmax_peers_per_rail = 4\n[tls]\ninsecure = true", "mesh.max_peers_per_rail",
     "at least mesh.peers_per_rail (5)"),
    ('[web]\nlisten = "0.0.0.0:7443"\n[tls]\ninsecure = true', "web.listen", "same address as aggregator.listen"),
    ("[validation]\nhost_budget_pps = 10\n[tls]\ninsecure = true", "validation.host_budget_pps", "= 10: expected"),
    ("[webs]\nlisten = 1", "webs", "unknown section"),
    ("aggregator = 3", "aggregator", "= 3: expected a [aggregator] table"),
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
    with pytest.raises(ConfigError, match=r"tls\.ca: = '.*nope\.pem': does not exist"):
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
    assert capsys.readouterr().err.strip() == f"{bad}: aggregator.heartbeat_s: = '5': expected a number from 0.5 to 300"
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
    from linkpassd.aggregator.settings import check_unix_listen

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
    ('store = "mysql"', "aggregator.store", "= 'mysql': expected one of sqlite, postgresql"),
    ('store = "postgresql"', "aggregator.postgresql_dsn", 'missing: store = "postgresql" needs postgresql_dsn'),
    ('postgresql_dsn = "postgresql://db/fleet"', "aggregator.postgresql_dsn", 'given, but store is "sqlite"'),
    ('store = "postgresql"\npostgresql_dsn = "mysql://db/fleet"', "aggregator.postgresql_dsn",
     "expected a postgresql:// URL"),
    ('store = "postgresql"\npostgresql_dsn = "db.example:5432"', "aggregator.postgresql_dsn",
     "expected a postgresql:// URL"),
    ('store = "postgresql"\npostgresql_dsn = "postgresql://db:99999/fleet"', "aggregator.postgresql_dsn",
     "not a postgresql:// URL"),
    ('store = "postgresql"\npostgresql_dsn = 5432', "aggregator.postgresql_dsn", "= 5432: expected a string"),
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
