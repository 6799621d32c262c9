"""What every health sensor backend answers, so code after the sensor is one path.

Production uses ``EthtoolSensor`` (ethtool netlink, rtnetlink, module EEPROM);
labs use ``SimulatedSensor`` (files written by labs/simsensor.py).  Both
return the core's value types and never raise for a bad or missing reading:
"not supported" is a None field, "cannot be trusted" is ``Unreadable``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from linkpassd.core.model import CounterSample, OpticsReading, Unreadable


@runtime_checkable
class Sensor(Protocol):
    async def counters(self, port: str) -> CounterSample:
        """Interface error counters as read; None where the source has none."""
        ...

    async def optics(self, port: str) -> OpticsReading | Unreadable:
        """The port's module diagnostics (DOM), or why they cannot be had."""
        ...

    def close(self) -> None:
        """Release sockets or files; the sensor is not used afterwards."""
        ...
