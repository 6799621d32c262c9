"""Shared by the aggregator tests: real certificates from scripts/linkpass-certs,
a real aggregator on 127.0.0.1 port 0 with the SQLite store, and TLS channels
as an agent, an operator or a stranger would open them."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import grpc

from linkpassd.aggregator.server import AggregatorServer
from linkpassd.aggregator.settings import Settings, TlsSettings
from linkpassd.aggregator.sqlite_store import SqliteStore

REPO = Path(__file__).resolve().parents[2]
CERTS_SCRIPT = REPO / "scripts" / "linkpass-certs"


def certs(*args: str) -> None:
    subprocess.run([str(CERTS_SCRIPT), *args], check=True, capture_output=True, timeout=60)


def make_pki(root: Path) -> Path:
    """ca + server "agg" (IP:127.0.0.1) + hosts h1, h2 + operator alice; and a
    second, untrusted CA in root/evil with its own h1."""
    d = root / "pki"
    certs("ca", str(d))
    certs("server", str(d), "agg", "IP:127.0.0.1")
    for host in ("h1", "h2", "h3"):
        certs("host", str(d), host)
    certs("operator", str(d), "alice")
    evil = root / "evil"
    certs("ca", str(evil))
    certs("host", str(evil), "h1")
    return d


def tls_settings(pki: Path, db: Path, **changes) -> Settings:
    base = Settings(source="(test)", listen="127.0.0.1:0", database=str(db),
                    tls=TlsSettings(ca=str(pki / "ca.pem"), cert=str(pki / "agg.pem"),
                                    key=str(pki / "agg-key.pem")))
    return replace(base, **changes)


def insecure_settings(db: Path, **changes) -> Settings:
    return replace(Settings(source="(test)", listen="127.0.0.1:0", database=str(db),
                            tls=TlsSettings(insecure=True)), **changes)


@contextlib.asynccontextmanager
async def serving(settings: Settings, **kwargs) -> AsyncIterator[AggregatorServer]:
    store = SqliteStore(settings.database)
    await store.open()
    server = AggregatorServer(settings, store, **kwargs)
    try:
        await server.start("127.0.0.1:0")
        yield server
    finally:
        await server.stop(0)
        await store.close()


def channel(port: int, pki: Path | None, who: str | None = None, ca: Path | None = None,
            options: list[tuple[str, object]] | None = None) -> grpc.aio.Channel:
    """A TLS channel presenting `who`'s certificate from `pki` (None: none);
    `ca` overrides the trusted CA. pki None: plaintext."""
    target = f"127.0.0.1:{port}"
    if pki is None:
        return grpc.aio.insecure_channel(target, options=options)
    key = cert = None
    if who is not None:
        key = (pki / f"{who}-key.pem").read_bytes()
        cert = (pki / f"{who}.pem").read_bytes()
    creds = grpc.ssl_channel_credentials((ca or pki / "ca.pem").read_bytes(), key, cert)
    return grpc.aio.secure_channel(target, creds, options=options)
