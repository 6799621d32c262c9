"""linkpass: keeps GPU-cluster jobs running through network link failures."""

__version__ = "0.1.0"
