"""RoCEv2 lab traffic: a sender in two modes and a receiver that measures blackout.

The two sender modes are the point (see DESIGN.md, "What moves, and when"):
``kernel-path`` is routed by the kernel per packet, like Soft-RoCE or TCP, so a
route change moves it at once; ``qp-pinned`` fixes egress interface and next-hop
MAC at connect, like a hardware queue pair, and only moves when its ACK retry
budget runs out and it reconnects.

Importing this package is cheap (no scapy, no pyroute2); the submodules are:

- ``analysis``  pure blackout / loss / reorder math (``analyse``)
- ``packets``   RoCEv2 wire format: build, parse, ICRC
- ``qp``        route and neighbour resolution through the kernel FIB
- ``sender``, ``receiver``  the two programs (``python -m labs.traffic.sender``)
"""

from labs.traffic.analysis import Analysis, Arrival, analyse

__all__ = ["Analysis", "Arrival", "analyse"]
