#!/usr/bin/env bash
# Build the linkpass Debian 12 package: dist/linkpass_<version>-<revision>_<arch>.deb
# (`make deb`; docs/install.md says what it installs).
#
#   /opt/linkpass          a venv on Debian's python3.11 (no pip in it): the project's
#                          wheel and its dependencies from PyPI, as binary wheels,
#                          byte-compiled for their installed paths
#   /usr/bin/...           links to its console scripts and linkpass-certs
#   /lib/systemd/system    systemd/*.service
#   /etc/linkpass          examples/*.toml as conffiles (dpkg keeps an edited one)
#   /usr/share/man         man pages from each program's --help (help2man)
#
# DEB_REVISION (default 1) is the Debian revision: 0.1.0-2 upgrades 0.1.0-1.
# Needs python3-venv, help2man and dpkg-deb (scripts/bootstrap.sh --apt-only)
# and the network for PyPI (pip's own configuration applies).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=/usr/bin/python3.11   # Debian 12's python3: the venv and its binary wheels are built for it
PREFIX=/opt/linkpass
PACKAGE=linkpass
REVISION=${DEB_REVISION:-1}
WORK=build/deb
ROOT=$PWD/$WORK/root
SCRIPTS=(linkpassd linkpassctl linkpass-aggregator linkpass-certs)

for tool in "$PY" help2man dpkg-deb; do
  command -v "$tool" >/dev/null || { echo "build-deb: $tool is missing; run scripts/bootstrap.sh --apt-only as root" >&2; exit 1; }
done
"$PY" -c 'import ensurepip' 2>/dev/null || { echo "build-deb: python3-venv is missing; run scripts/bootstrap.sh --apt-only as root" >&2; exit 1; }

version=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
[[ $REVISION =~ ^[0-9][A-Za-z0-9.+~]*$ ]] || { echo "build-deb: DEB_REVISION=${REVISION@Q} is not a Debian revision" >&2; exit 2; }
debversion=$version-$REVISION
arch=$(dpkg --print-architecture)
out=dist/${PACKAGE}_${debversion}_${arch}.deb

rm -rf "$WORK"
mkdir -p "$WORK" dist

echo "build-deb: the project's wheel"
# From a copy of what the wheel is made of (working-tree edits included), so
# no stale build/lib of an earlier build leaks into it.
mkdir -p "$WORK/src/scripts"
cp pyproject.toml README.md LICENSE "$WORK/src/"
cp scripts/linkpass-certs "$WORK/src/scripts/"
tar -C . --exclude=__pycache__ --exclude='*.pyc' -cf - linkpassd | tar -C "$WORK/src" -xf -
"$PY" -m venv "$WORK/tools"   # pip for the build (Debian refuses a system-wide pip install)
"$WORK/tools/bin/pip" wheel -q --no-deps -w "$WORK/wheels" "./$WORK/src"
wheel=$(ls "$WORK"/wheels/linkpass-"$version"-*.whl)

echo "build-deb: $PREFIX with its dependencies"
"$PY" -m venv --without-pip "$ROOT$PREFIX"
"$WORK/tools/bin/pip" --python "$ROOT$PREFIX/bin/python3" install -q --no-compile \
  --only-binary :all: "$wheel"
for name in "${SCRIPTS[@]}"; do
  [ -x "$ROOT$PREFIX/bin/$name" ] || { echo "build-deb: the venv has no bin/$name" >&2; exit 1; }
done
"$WORK/tools/bin/pip" --python "$ROOT$PREFIX/bin/python3" freeze --all \
  | sed "s#^linkpass @ .*#linkpass==$version#" >"$WORK/freeze.txt"

echo "build-deb: man pages"
man="$ROOT/usr/share/man"
mkdir -p "$man/man1" "$man/man8"
"$ROOT$PREFIX/bin/python3" packaging/deb/man_commands.py linkpassd.ctl.main:cli linkpassctl >"$WORK/linkpassctl.h2m"
page() {  # page SECTION NAME DESCRIPTION [help2man options]
  local section=$1 name=$2 what=$3
  shift 3
  help2man --no-info --section "$section" --version-string "$version" --name "$what" \
    --source "linkpass $version" "$@" --output "$man/man$section/$name.$section" "$ROOT$PREFIX/bin/$name"
  gzip -9n "$man/man$section/$name.$section"
}
page 8 linkpassd "per-host daemon keeping GPU-cluster traffic on healthy links"
page 8 linkpass-aggregator "linkpass fleet aggregator (gRPC, mTLS)"
page 1 linkpassctl "query and operate the local linkpassd and the linkpass fleet" \
  --include "$WORK/linkpassctl.h2m"
page 1 linkpass-certs "issue the certificates of linkpass-aggregator and its agents"

echo "build-deb: relocating to $PREFIX"
# The venv was made at $ROOT$PREFIX: scripts' shebangs and pyvenv.cfg name that path.
grep -rlIZ -- "$ROOT" "$ROOT$PREFIX" | xargs -0 -r sed -i "s#$ROOT##g"
if grep -rlI -- "$ROOT" "$ROOT$PREFIX"; then
  echo "build-deb: files above still name the build directory" >&2
  exit 1
fi
# Byte-compiled for the installed paths: the unit's file system is read-only,
# so nothing could write them later.
"$PY" -m compileall -q -j 0 -s "$ROOT" -p / "$ROOT$PREFIX/lib"

mkdir -p "$ROOT/usr/bin" "$ROOT/lib/systemd/system" "$ROOT/etc/linkpass" "$ROOT/usr/share/doc/$PACKAGE"
for name in "${SCRIPTS[@]}"; do
  ln -s "$PREFIX/bin/$name" "$ROOT/usr/bin/$name"
done
install -m 0644 systemd/linkpassd.service systemd/linkpass-aggregator.service "$ROOT/lib/systemd/system/"
install -m 0644 examples/linkpassd.toml examples/aggregator.toml "$ROOT/etc/linkpass/"
install -m 0644 README.md "$ROOT/usr/share/doc/$PACKAGE/README.md"
install -m 0644 "$WORK/freeze.txt" "$ROOT/usr/share/doc/$PACKAGE/python-packages.txt"
cat >"$ROOT/usr/share/doc/$PACKAGE/copyright" <<EOF
linkpass $version, built from its sources with the Python packages listed in
python-packages.txt (each under its own licence, in $PREFIX/lib/python3.11/site-packages/*.dist-info).

License: Apache-2.0
 On Debian systems the full text of the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
EOF

mkdir -p "$ROOT/DEBIAN"
install -m 0755 packaging/deb/postinst packaging/deb/prerm packaging/deb/postrm "$ROOT/DEBIAN/"
printf '%s\n' /etc/linkpass/linkpassd.toml /etc/linkpass/aggregator.toml >"$ROOT/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$ROOT" | cut -f1)
cat >"$ROOT/DEBIAN/control" <<EOF
Package: $PACKAGE
Version: $debversion
Architecture: $arch
Maintainer: linkpass developers <linkpass@users.noreply.invalid>
Installed-Size: $size
Depends: python3.11, adduser
Recommends: openssl
Suggests: frr, lldpd
Section: net
Priority: optional
Description: keeps GPU-cluster jobs running through network link failures
 linkpassd watches every rail (NIC port) of a host, decides which paths are
 healthy and rewrites the host's policy routing and resilient nexthop groups
 so that traffic leaves through healthy ports. linkpass-aggregator keeps the
 fleet's state and event history; linkpassctl shows what they see and why.
 .
 The application lives in its own virtual environment under $PREFIX.
EOF

dpkg-deb --root-owner-group -Zxz --build "$ROOT" "$out" >/dev/null
echo "build-deb: $out"
dpkg-deb --info "$out" | sed -n 's/^ \(Package\|Version\|Architecture\|Installed-Size\|Depends\):/  \1:/p'
