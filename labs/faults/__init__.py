"""Faults injected inside lab nodes only; each has inject()/clear() and
monotonic ``injected_at``/``cleared_at`` stamps (see base.Fault).

    from labs.faults import CablePull
    with dualrail() as lab:
        fault = CablePull(lab, "lph1", 0)
        t0 = fault.inject(); ...; fault.clear()

Faults that install rules (nft drops, the tbf pause) can be armed ahead of
the trial with ``fault.arm()``: inject()/clear() are then one netlink request
each (see base.py).
"""

from labs.faults.base import Fault
from labs.faults.blackhole import LeafPortBlackhole, SpineLinkBlackhole, SpineLinkLoss
from labs.faults.link import CablePull, Flap
from labs.faults.miswire import Miswire
from labs.faults.nft import HostPortLoss, NftFault, OneWayLoss, RandomLoss, SilentBlackhole
from labs.faults.optics import OpticDegradation
from labs.faults.pause import LeafPause

__all__ = ["Fault", "CablePull", "Flap", "HostPortLoss", "LeafPause", "LeafPortBlackhole", "Miswire",
           "NftFault", "OneWayLoss", "RandomLoss", "SilentBlackhole", "SpineLinkBlackhole",
           "SpineLinkLoss", "OpticDegradation"]
