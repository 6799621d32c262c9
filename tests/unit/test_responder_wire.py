"""What the daemon tells its responder process (linkpassd.responder): the policy on a pipe."""

from __future__ import annotations

import json

import pytest

from linkpassd.core.admission import ResponderPolicy
from linkpassd.responder import policy_from_wire, policy_to_wire


@pytest.mark.parametrize("policy", [
    ResponderPolicy.build({"198.18.0.1", "198.18.1.1"}, ["198.18.0.0/16"], {"198.19.5.5"},
                          rate_pps=250.0, burst=7, max_sources=9),
    ResponderPolicy.build(None, ["198.18.0.0/15"]),  # any local address (the labs' peer)
    ResponderPolicy(),  # answers nobody
])
def test_a_policy_survives_the_pipe(policy):
    assert policy_from_wire(json.loads(json.dumps(policy_to_wire(policy)))) == policy


@pytest.mark.parametrize("fields, names", [
    ([], "object"),
    ({"fabric_prefixes": ["198.18.0.0/16"], "rate_pps": 1.0, "burst": 1}, "max_sources"),
    ({"fabric_prefixes": ["not a prefix"], "rate_pps": 1.0, "burst": 1, "max_sources": 1},
     "not a prefix"),
    ({"rate_pps": 0, "burst": 1, "max_sources": 1}, "rate_pps"),
])
def test_a_bad_policy_is_refused_naming_what_is_wrong(fields, names):
    with pytest.raises((ValueError, TypeError, KeyError), match=names):
        policy_from_wire(fields)
