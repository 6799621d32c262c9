"""How people are shown a point in time: ISO 8601 in the local zone, with its
offset (`2027-01-15T09:30:00+01:00`), so a time read off a terminal can be
compared with a log, a ticket or a colleague's screen in another zone.
Raw unix seconds stay in JSON output and files, never in text for people.
"""

from __future__ import annotations

from datetime import datetime


def local_iso(unix: float, *, ms: bool = False) -> str:
    """`unix` seconds as local ISO 8601 with the zone's offset; seconds, or
    milliseconds with `ms`."""
    return datetime.fromtimestamp(unix).astimezone().isoformat(
        timespec="milliseconds" if ms else "seconds")
