#!/usr/bin/env bash
# Install what linkpass needs on a Debian machine: apt packages, then a venv.
# Idempotent: a second run installs nothing new and finishes in seconds.
# --apt-only: the apt packages only (what `make deb` needs; no venv).
set -euo pipefail
cd "$(dirname "$0")/.."
apt_only=0
[ "${1-}" = --apt-only ] && apt_only=1

# chromium: the headless browser test of the aggregator's page (tests/labs/test_fleet_lab.py).
# lldpd: the LLDP speaker of the lab's switches (labs/lldp.py runs one per lab node, in its namespace).
# postgresql: the server binaries for the aggregator's PostgreSQL store tests (labs/pgcluster.py runs a
#   private one per test session, on a Unix socket in a temporary directory); never a system cluster.
# help2man: the man pages of the Debian package (`make deb`, scripts/build-deb.sh).
APT_PACKAGES=(iproute2 ethtool nftables tshark tcpdump iputils-ping mininet frr python3-venv python3-dev gcc prometheus chromium lldpd postgresql help2man)
# Services those packages would start on install and that must not run here (see below).
NO_START=(lldpd postgresql)

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
  # Installing lldpd must never start the machine's own lldpd: it would speak
  # LLDP on the host's real interfaces (the labs run private ones, by PID).
  # Installing postgresql must never create or start a system cluster (the
  # tests run private ones): Debian's package creates a "main" cluster unless
  # createcluster.conf says create_main_cluster = false, which is written
  # first (ucf keeps that file: UCF_FORCE_CONFFOLD), and then starts it.
  # invoke-rc.d and deb-systemd-invoke ask /usr/sbin/policy-rc.d before
  # starting a service; when the machine has none, a temporary one denies
  # the NO_START services being installed (exit 101) and allows everything
  # else (exit 0, as having no policy does), and is removed right after. A
  # policy the machine already has is left alone. Where systemd runs, those
  # units are also disabled for later boots (and stopped, should an existing
  # policy have let them start).
  blocked=()
  for svc in "${NO_START[@]}"; do
    [[ " ${missing[*]} " == *" $svc "* ]] && blocked+=("$svc")
  done
  if [[ " ${missing[*]} " == *" postgresql "* ]]; then
    conf=/etc/postgresql-common/createcluster.conf
    mkdir -p "$(dirname "$conf")"
    touch "$conf"
    if grep -Eq '^[#[:space:]]*create_main_cluster[[:space:]]*=' "$conf"; then
      sed -i -E 's/^[#[:space:]]*create_main_cluster[[:space:]]*=.*/create_main_cluster = false/' "$conf"
    else
      echo 'create_main_cluster = false' >>"$conf"
    fi
    export UCF_FORCE_CONFFOLD=1
  fi
  policy=/usr/sbin/policy-rc.d
  own_policy=0
  if [ ${#blocked[@]} -gt 0 ] && [ ! -e "$policy" ]; then
    pattern=""
    for svc in "${blocked[@]}"; do
      pattern+="${pattern:+|}$svc|$svc.service|$svc@*"
    done
    printf '#!/bin/sh\n# temporary, from linkpass scripts/bootstrap.sh\ncase "$1" in %s) exit 101;; esac\nexit 0\n' \
      "$pattern" >"$policy"
    chmod 755 "$policy"
    own_policy=1
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [ "$own_policy" = 1 ]; then
    rm -f "$policy"
    trap - EXIT
  fi
  if [ ${#blocked[@]} -gt 0 ] && [ -d /run/systemd/system ]; then
    for svc in "${blocked[@]}"; do
      systemctl disable --now "$svc.service" >/dev/null 2>&1 || true
    done
  fi
fi

[ "$apt_only" = 1 ] && exit 0

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.linkpass-installed
# Reinstalled when pyproject.toml changed, or when a tool of the dev extra
# that `make` runs is missing (a venv made before it was added).
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ ! -x .venv/bin/ruff ] || [ ! -x .venv/bin/mypy ]; then
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
