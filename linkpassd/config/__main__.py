"""`python -m linkpassd.config (--reference [daemon | aggregator] | FILE)`."""

import sys

from linkpassd.config.reference import _main

sys.exit(_main(sys.argv[1:]))
