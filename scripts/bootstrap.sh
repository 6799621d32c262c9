#!/usr/bin/env bash
# Install what linkpass needs on a Debian machine: apt packages, then a venv.
# Idempotent: a second run installs nothing new and finishes in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

# chromium: the headless browser test of the aggregator's page (tests/labs/test_fleet_lab.py).
APT_PACKAGES=(iproute2 ethtool nftables tshark tcpdump iputils-ping mininet frr python3-venv python3-dev gcc prometheus chromium)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: missing apt packages (${missing[*]}); run as root to install them" >&2
    exit 1
  fi
  echo "bootstrap: installing apt packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.linkpass-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "bootstrap: installing Python dependencies into .venv"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[dev,labs]'
  touch "$stamp"
fi

# buf (lint and breaking-change check of proto/, run by `make proto-check`),
# pinned, from npm into .tools/ (not committed).
BUF_VERSION=1.75.0
BUF=.tools/node_modules/.bin/buf
if [ "$("$BUF" --version 2>/dev/null || true)" != "$BUF_VERSION" ]; then
  if ! command -v npm >/dev/null; then
    if [ "$(id -u)" -ne 0 ]; then
      echo "bootstrap: npm is missing (needed for buf); run as root to install it" >&2
      exit 1
    fi
    echo "bootstrap: installing npm (for buf)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
  fi
  echo "bootstrap: installing buf $BUF_VERSION into .tools"
  npm install --prefix .tools --no-save --no-audit --no-fund --loglevel=error "@bufbuild/buf@$BUF_VERSION" >/dev/null
fi
