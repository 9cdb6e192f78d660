#!/bin/bash
# setup-host.sh - install what the Soft-RoCE test bed needs, from the package
# registries only. Idempotent: a second run installs nothing.
#
# Host packages come from bookworm. QEMU comes from bookworm-backports, because
# new machines already carry qemu-utils 10.0.2 from there and bookworm's QEMU 7.2
# would remove it. trixie/sid appear only as deb-src entries (for apt-get source):
# a binary entry for them would pull libc6 from sid onto the host.
set -euo pipefail
SRC=/etc/apt/sources.list.d/valkey-rdma-testbed.sources
want_sources() {
cat <<'SRCS'
# written by valkey-rdma testbed/setup-host.sh
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian
Suites: sid trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRCS
}
if ! cmp -s <(want_sources) "$SRC" 2>/dev/null; then
    want_sources > "$SRC"
    rm -f /var/lib/apt/periodic/valkey-rdma-updated
fi

PKGS_BOOKWORM=(busybox-static kmod cpio xz-utils zstd bc rdma-core libibverbs1 librdmacm1
    ibverbs-providers ibverbs-utils rdmacm-utils libibverbs-dev librdmacm-dev libclang-dev
    clang-14 iproute2 dpkg-dev build-essential pkg-config libjemalloc-dev libsystemd-dev
    libssl-dev python3-pip liblzf1 libjemalloc2 lintian man-db groff-base rpm rpmlint valgrind)
PKGS_BPO=(qemu-system-x86 qemu-utils)

missing=()
for p in "${PKGS_BOOKWORM[@]}" "${PKGS_BPO[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ! -e /var/lib/apt/periodic/valkey-rdma-updated ] || [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    mkdir -p /var/lib/apt/periodic && touch /var/lib/apt/periodic/valkey-rdma-updated
fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup-host: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq -t bookworm --no-install-recommends "${PKGS_BOOKWORM[@]}"
    # libobjc4 pinned to bookworm, or apt upgrades it from a newer suite
    apt-get install -y -qq -t bookworm-backports --no-install-recommends "${PKGS_BPO[@]}" libobjc4/bookworm
fi
echo "setup-host: host packages ready"
