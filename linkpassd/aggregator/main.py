"""Entry point of `linkpass-aggregator`, which this release does not have yet.

It exits 2 with one line instead of pretending to serve, so a unit file or
script that starts it fails visibly.
"""

from __future__ import annotations

import sys


def main() -> None:
    print("linkpass-aggregator: not implemented in this release (linkpassd and linkpassctl work without it)",
          file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
