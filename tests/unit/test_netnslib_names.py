"""Which namespace names labs.netnslib may delete as left by a gone run."""

import os

from labs.netnslib import stale_names, unique_name


def test_only_own_names_of_gone_processes_are_stale():
    names = ["lp-h100-3", "lp-l100-4", "lp-h200-0", "lp-tr100a", "lprha100", "other-100-1",
             "lp-h100", unique_name("h")]
    alive = {200, os.getpid()}.__contains__  # unique_name's is ours
    assert stale_names(names, alive) == ["lp-h100-3", "lp-l100-4"]
