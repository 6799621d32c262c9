# The two commands of the README: `make demo` (the lab) and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
PYTEST := $(VENV)/bin/pytest

RUFF := $(VENV)/bin/ruff
MYPY := $(VENV)/bin/mypy

.PHONY: bootstrap lint test unit netns labs proto proto-check demo bench deb clean

bootstrap:
	./scripts/bootstrap.sh

## make lint: ruff over the tree, mypy --strict over linkpassd/core (docs/lint.md)
lint: bootstrap
	$(RUFF) check .
	$(MYPY)

## make test: everything CI runs (lint, generated-stub check, unit, netns as root)
test: bootstrap lint proto-check
	$(PYTEST) -q tests

unit: bootstrap
	$(PYTEST) -q tests/unit

netns: bootstrap
	$(PYTEST) -q -m netns tests/netns

proto: bootstrap
	./scripts/gen_proto.sh

## Regenerates the gRPC stubs into a scratch tree and fails on any difference;
## then buf: lint, and no breaking change against the last released API
## (the newest proto/releases/*.binpb; see proto/README.md).
BUF := .tools/node_modules/.bin/buf
proto-check: bootstrap
	./scripts/gen_proto.sh --check
	$(BUF) lint proto
	$(BUF) breaking proto --against "$$(ls proto/releases/*.binpb | sort -V | tail -n 1)"

## make demo: the dualrail lab, a cable pull and a silent blackhole, measured (root)
demo: bootstrap
	@[ "$$(id -u)" -eq 0 ] || { echo "make demo: needs root (network namespaces)" >&2; exit 1; }
	$(PY) -m labs.demo

bench: bootstrap
	$(PY) -m labs.bench.carrier_failover
	$(PY) -m labs.bench.failover
	$(PY) -m labs.bench.probing

## make deb: the Debian 12 package, dist/linkpass_<version>-<rev>_<arch>.deb
## (docs/install.md); DEB_REVISION=2 makes an upgrade of -1. Needs no .venv.
deb:
	./scripts/bootstrap.sh --apt-only
	./scripts/build-deb.sh

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache .mypy_cache *.egg-info build dist
