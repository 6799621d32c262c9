"""Adapters: the only code that touches the kernel, sockets or clocks."""
