"""Who a linkpass certificate names: the rules the aggregator authorises
callers by, shared with the host's own check before it connects
(`linkpassd --check-config`, config.certcheck), so the two can never differ.

- a *host* certificate carries the URI SAN `linkpass://host/<host_id>` and
  names the same host as DNS SAN (or, without DNS SANs, as its CN): both must
  agree, so a certificate issued for a web server named like a host does not
  pass as that host, nor one whose names contradict each other;
- an *operator* certificate carries the URI SAN `linkpass://operator/<name>`.
More than one identity of a kind makes the certificate ambiguous: it gets none.
(docs/aggregator.md; scripts/linkpass-certs issues such certificates.)
"""

from __future__ import annotations

from dataclasses import dataclass

HOST_URI_PREFIX = "linkpass://host/"
OPERATOR_URI_PREFIX = "linkpass://operator/"


@dataclass(frozen=True)
class PeerIdentity:
    host_id: str | None  # the host this certificate may report as
    operator: str | None  # the operator it belongs to
    subject: str  # for messages and logs: what the certificate says
    insecure: bool = False  # plaintext lab mode: nothing was verified

    def describe(self) -> str:
        if self.insecure:
            return "an unverified peer (insecure mode)"
        return f"certificate {self.subject}"


def _one(values: list[str]) -> str | None:
    distinct = sorted(set(values))
    return distinct[0] if len(distinct) == 1 else None


def from_certificate(pem: bytes) -> PeerIdentity:
    """The identity the aggregator will see for this PEM certificate, by the
    same rules (for `linkpassd --check-config`, before any connection).
    ValueError when the data is not a PEM certificate."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_pem_x509_certificate(pem)
    cn = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        uris, dns = [], []
    else:
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
        dns = san.get_values_for_type(x509.DNSName)
    return from_names(uris=uris, dns=dns, cn=cn)


def from_names(*, uris: list[str], dns: list[str], cn: list[str]) -> PeerIdentity:
    """The identity a certificate with these names gets (see the module doc)."""
    uri_hosts = [u[len(HOST_URI_PREFIX):] for u in uris if u.startswith(HOST_URI_PREFIX)]
    operators = [u[len(OPERATOR_URI_PREFIX):] for u in uris if u.startswith(OPERATOR_URI_PREFIX)]
    host = _one(uri_hosts)
    if host is not None:
        names = dns if dns else cn  # the CN counts only without DNS SANs (RFC 6125)
        if host not in names or not host:
            host = None
    operator = _one(operators)
    if operator == "":
        operator = None
    parts = [f"CN={cn[0]}"] if cn else []
    parts += [f"DNS:{d}" for d in dns] + [f"URI:{u}" for u in uris]
    return PeerIdentity(host_id=host, operator=operator, subject="[" + ", ".join(parts or ["no names"]) + "]")
