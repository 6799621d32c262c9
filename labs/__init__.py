"""Labs: namespaces and Mininet topologies, faults, traffic and benchmarks."""
