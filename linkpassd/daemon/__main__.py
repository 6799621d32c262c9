"""`python -m linkpassd.daemon`: the same as the `linkpassd` command."""

import sys

from linkpassd.daemon.cli import main

sys.exit(main())
