"""Mininet topologies: a rail-optimised L3 fabric of hosts, leaves and spines.

    from labs.topos.railopt import railopt      # N hosts x R rails x S spines
    from labs.topos.dualrail import dualrail    # railopt(2, 2, 1)
    with railopt(hosts=4, rails=2, spines=2, mechanism="kernel") as lab: ...

The package itself imports nothing: importing one of its modules (plan, nl)
must not start the whole lab (lab.py, which imports lldp, aggproc, simsensor
and frr), or those could never import plan or nl without a circle.
"""
