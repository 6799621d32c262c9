"""Mininet topologies: a rail-optimised L3 fabric of hosts, leaves and spines.

    from labs.topos.railopt import railopt      # N hosts x R rails x S spines
    from labs.topos.dualrail import dualrail    # railopt(2, 2, 1)
    with railopt(hosts=4, rails=2, spines=2, mechanism="kernel") as lab: ...
"""

from labs.topos.lab import Lab, LabLeakError, PingResult
from labs.topos.plan import MECHANISMS, FabricPlan, HostPlan, HostRail, LabError

__all__ = ["Lab", "LabError", "LabLeakError", "PingResult", "FabricPlan", "HostPlan",
           "HostRail", "MECHANISMS"]
