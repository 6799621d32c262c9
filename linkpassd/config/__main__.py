"""`python -m linkpassd.config (--reference | FILE)`."""

import sys

from linkpassd.config.reference import _main

sys.exit(_main(sys.argv[1:]))
