"""Will the aggregator take this host? The check `linkpassd --check-config`
runs on [aggregator]: the host_id the agent says in its Hello against the
host its client certificate names, by the aggregator's own rules
(fleet.identity). A mismatch is refused at every connection
(PERMISSION_DENIED), and the host never appears in the fleet: better said
before the daemon starts, naming both.
"""

from __future__ import annotations

import socket

from linkpassd.core.model import AggregatorSettings
from linkpassd.fleet.identity import HOST_URI_PREFIX, from_certificate


def expected_host_id(settings: AggregatorSettings) -> tuple[str, str]:
    """(host_id the agent sends, where it comes from)."""
    if settings.host_id:
        return settings.host_id, "[aggregator] host_id"
    return socket.gethostname(), "this host's name ([aggregator] host_id is not set)"


def host_id_problem(settings: AggregatorSettings | None) -> str | None:
    """Why the aggregator would refuse this host's certificate, or None.
    Plaintext (insecure) and standalone configs have nothing to check."""
    if settings is None or settings.insecure:
        return None
    host_id, origin = expected_host_id(settings)
    try:
        with open(settings.cert, "rb") as f:
            pem = f.read()
    except OSError as exc:
        return f"[aggregator] cert {settings.cert}: {exc.strerror or exc}"
    try:
        identity = from_certificate(pem)
    except ValueError as exc:
        return f"[aggregator] cert {settings.cert} is not a PEM certificate: {exc}"
    if identity.host_id == host_id:
        return None
    fix = (f"set [aggregator] host_id = \"{identity.host_id}\", or issue a certificate for "
           f"{host_id!r} (linkpass-certs host DIR {host_id})")
    if identity.host_id is None:
        named = (f"names no host (a host certificate carries the URI SAN "
                 f"{HOST_URI_PREFIX}<host_id> and the same name as its DNS SAN)")
        fix = f"issue a host certificate for {host_id!r} (linkpass-certs host DIR {host_id})"
    else:
        named = f"names host {identity.host_id!r}"
    return (f"host_id {host_id!r} (from {origin}) does not match the certificate "
            f"{settings.cert} {identity.subject}, which {named}: the aggregator refuses "
            f"this host; {fix}")
