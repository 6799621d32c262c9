"""Two hosts, two rails, one leaf per rail, one spine: railopt(2, 2, 1).

The smallest fabric where a rail can fail over to another one; the same code
as railopt, so what holds here holds for the parametric lab.

    python -m labs.topos.dualrail --mechanism kernel --check
"""

from __future__ import annotations

import sys

from labs.topos.lab import Lab
from labs.topos.railopt import main, railopt


def dualrail(mechanism: str = "none", **options) -> Lab:
    """An unstarted 2 x 2 x 1 Lab (see railopt.railopt for ``options``)."""
    return railopt(2, 2, 1, mechanism, **options)


if __name__ == "__main__":
    sys.exit(main(defaults=(2, 2, 1), prog="labs.topos.dualrail"))
