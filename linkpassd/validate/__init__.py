"""Fleet validation (issue 13): prove every cable, optic and path against a
cabling plan before a cluster is handed over.

Pure modules (no sockets, asyncio or clocks): `plan` (the cabling file),
`probeplan` (which host pairs probe on each rail), `results` (what hosts
report, as plain values), `localize` (which link or device is at fault) and
`report` (terminal text, JSON, PNG). The host side of a validation is
linkpassd.adapters.hostcheck, run by the daemon.
"""
