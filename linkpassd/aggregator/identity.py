"""Who is calling: the host or operator a client certificate names.

gRPC has already verified the certificate chain against our CA when a call
reaches us (the server requires a client certificate; no certificate or an
untrusted one fails the TLS handshake, before any handler runs). What is left
is reading the names, which grpc puts into `context.auth_context()` as lists
of bytes (verified against grpcio 1.85 in tests/unit/test_agg_identity.py):

    x509_common_name               [b"h1"]
    x509_subject_alternative_name  [b"h1", b"linkpass://host/h1"]  (every SAN, mixed)
    peer_dns                       [b"h1"]                          (DNS SANs)
    peer_uri                       [b"linkpass://host/h1"]          (URI SANs)

(`peer_spiffe_id` appears only for a single spiffe:// URI: not ours.)

What they mean is decided by the rules in fleet.identity (shared with the
host's own check of its certificate).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import grpc

from linkpassd.fleet.identity import PeerIdentity, from_names


@dataclass(frozen=True)
class Refusal:
    """A host the aggregator refused: what its Hello said, what its
    certificate names, and when (the page lists it under "Needs a look")."""

    host_id: str  # as the Hello said
    certificate: str  # PeerIdentity.subject
    reason: str
    peer: str
    at: float  # unix time of the latest refusal


INSECURE = PeerIdentity(host_id=None, operator=None, subject="(insecure mode)", insecure=True)


def _texts(values: Iterable[bytes] | None) -> list[str]:
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in values or ()]


def from_auth_context(auth: Mapping[str, Iterable[bytes]]) -> PeerIdentity:
    """The identity a verified certificate's names give (fleet.identity's rules)."""
    return from_names(uris=_texts(auth.get("peer_uri")), dns=_texts(auth.get("peer_dns")),
                      cn=_texts(auth.get("x509_common_name")))


def peer_identity(context: grpc.aio.ServicerContext, insecure: bool) -> PeerIdentity:
    """The caller of this RPC; INSECURE in plaintext mode (nothing to read)."""
    if insecure:
        return INSECURE
    return from_auth_context(context.auth_context() or {})
