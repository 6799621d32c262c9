"""The host and operator identities certificates carry (aggregator/identity.py),
and the certificates scripts/linkpass-certs issues.

The first test pins what grpc really puts into auth_context() for our
certificates over a real TLS connection: the rest relies on those keys."""

from __future__ import annotations

import asyncio
import stat
import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from agg_tls import CERTS_SCRIPT, channel, make_pki
from linkpassd.aggregator.identity import from_auth_context


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("agg-pki"))


class _Recorder(health.aio.HealthServicer):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict[str, list[bytes]]] = []

    async def Check(self, request, context):  # grpc's name
        self.seen.append(dict(context.auth_context()))
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


def auth_contexts_over_tls(pki: Path, *who: str) -> list[dict[str, list[bytes]]]:
    async def scenario() -> list[dict[str, list[bytes]]]:
        server = grpc.aio.server()
        recorder = _Recorder()
        health_pb2_grpc.add_HealthServicer_to_server(recorder, server)
        creds = grpc.ssl_server_credentials(
            [((pki / "agg-key.pem").read_bytes(), (pki / "agg.pem").read_bytes())],
            root_certificates=(pki / "ca.pem").read_bytes(), require_client_auth=True)
        port = server.add_secure_port("127.0.0.1:0", creds)
        await server.start()
        try:
            for name in who:
                async with channel(port, pki, name) as ch:
                    await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=20)
        finally:
            await server.stop(None)
        return recorder.seen

    return asyncio.run(asyncio.wait_for(scenario(), 60))


def test_grpc_auth_context_carries_our_sans_and_they_give_the_identities(pki: Path) -> None:
    host_ctx, operator_ctx = auth_contexts_over_tls(pki, "h1", "alice")
    assert host_ctx["peer_uri"] == [b"linkpass://host/h1"]
    assert host_ctx["peer_dns"] == [b"h1"]
    assert host_ctx["x509_common_name"] == [b"h1"]
    assert sorted(host_ctx["x509_subject_alternative_name"]) == [b"h1", b"linkpass://host/h1"]
    assert "peer_spiffe_id" not in host_ctx  # only for spiffe:// URIs
    assert operator_ctx["peer_uri"] == [b"linkpass://operator/alice"]
    assert "peer_dns" not in operator_ctx

    host = from_auth_context(host_ctx)
    assert (host.host_id, host.operator) == ("h1", None)
    assert host.subject == "[CN=h1, DNS:h1, URI:linkpass://host/h1]"
    operator = from_auth_context(operator_ctx)
    assert (operator.host_id, operator.operator) == (None, "alice")


def ctx(cn: str = "", dns: tuple[str, ...] = (), uris: tuple[str, ...] = ()) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    if cn:
        out["x509_common_name"] = [cn.encode()]
    if dns:
        out["peer_dns"] = [d.encode() for d in dns]
    if uris:
        out["peer_uri"] = [u.encode() for u in uris]
    return out


@pytest.mark.parametrize("auth, host", [
    (ctx("h1", ("h1",), ("linkpass://host/h1",)), "h1"),
    (ctx("h1", (), ("linkpass://host/h1",)), "h1"),  # no DNS SAN: the CN names it
    (ctx("x", ("h1", "h1.example"), ("linkpass://host/h1",)), "h1"),
    (ctx("h1", ("h1",)), None),  # a plain server certificate is no host certificate
    (ctx("h1", ("h2",), ("linkpass://host/h1",)), None),  # DNS SAN wins over the CN, and disagrees
    (ctx("h2", (), ("linkpass://host/h1",)), None),
    (ctx("h1", ("h1", "h2"), ("linkpass://host/h1", "linkpass://host/h2")), None),  # ambiguous
    (ctx("", (), ("linkpass://host/",)), None),
])
def test_host_identity_needs_the_uri_and_a_matching_dns_name(auth, host) -> None:
    assert from_auth_context(auth).host_id == host


@pytest.mark.parametrize("auth, operator", [
    (ctx("alice", (), ("linkpass://operator/alice",)), "alice"),
    (ctx("alice"), None),  # a CN is not an operator identity
    (ctx("", (), ("linkpass://operator/a", "linkpass://operator/b")), None),
    (ctx("", (), ("linkpass://operator/",)), None),
    (ctx("", (), ("https://operator/alice",)), None),
])
def test_operator_identity_is_one_operator_uri(auth, operator) -> None:
    assert from_auth_context(auth).operator == operator


def test_the_certs_script_writes_private_keys_and_refuses_bad_names(tmp_path: Path) -> None:
    d = tmp_path / "pki"

    def run(*a: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(CERTS_SCRIPT), *a], capture_output=True, text=True, timeout=60)

    assert run("ca", str(d)).returncode == 0
    again = run("ca", str(d))
    assert again.returncode == 2 and "not overwriting" in again.stderr
    assert run("host", str(d), "gpu-01.rack3").returncode == 0
    assert stat.S_IMODE((d / "gpu-01.rack3-key.pem").stat().st_mode) == 0o600
    text = subprocess.run(["openssl", "x509", "-in", str(d / "gpu-01.rack3.pem"), "-noout", "-ext",
                           "subjectAltName,extendedKeyUsage"], capture_output=True, text=True,
                          timeout=60, check=True).stdout
    assert "DNS:gpu-01.rack3, URI:linkpass://host/gpu-01.rack3" in text and "Client Authentication" in text
    for bad in ("../etc", "-x", "a b", "ca"):
        refused = run("host", str(d), bad)
        assert refused.returncode == 2 and "host id" in refused.stderr, bad
    missing = run("operator", str(tmp_path / "nothing"), "bob")
    assert missing.returncode == 2 and "no CA in" in missing.stderr
