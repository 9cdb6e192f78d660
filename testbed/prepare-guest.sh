#!/bin/bash
# prepare-guest.sh - fetch a Debian kernel whose rdma_rxe is a module (downloaded and
# extracted, never installed on the host), extract an uncompressed vmlinux for a fast
# PVH boot, and build the guest's initramfs. Idempotent.
set -euo pipefail
. "$(dirname "$(readlink -f "$0")")/env.sh"
mkdir -p "$GUEST_KROOT"
if [ ! -d "$GUEST_KROOT/root/lib/modules" ]; then
    # The metapackage names the current ABI package, e.g. linux-image-6.1.0-57-amd64.
    pkg=$(apt-cache depends "$GUEST_KERNEL_META" 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
    [ -n "$pkg" ] || { log "cannot resolve $GUEST_KERNEL_META (run testbed/setup-host.sh)"; exit 1; }
    log "downloading guest kernel $pkg"
    tmp=$(mktemp -d "$GUEST_KROOT/dl.XXXXXX")
    ( cd "$tmp" && apt-get download -q "$pkg" )
    dpkg-deb -x "$tmp"/*.deb "$tmp/root"
    # Keep only what the guest needs: the kernel image and the modules.
    rm -rf "$tmp/root/usr" "$tmp"/*.deb
    mv "$tmp/root" "$GUEST_KROOT/root"; rmdir "$tmp"
fi
KVER=$(ls "$GUEST_KROOT/root/lib/modules" | head -n1)
[ -f "$GUEST_KROOT/root/lib/modules/$KVER/modules.dep" ] || depmod -b "$GUEST_KROOT/root" "$KVER"
if [ ! -f "$GUEST_KROOT/vmlinux" ]; then
    # An uncompressed ELF boots through QEMU's PVH entry point: ~5 s faster under TCG
    # than the bzImage (no real-mode setup, no in-guest decompression).
    python3 "$TESTBED_SCRIPTS/extract-vmlinux.py" "$GUEST_KROOT"/root/boot/vmlinuz-* "$GUEST_KROOT/vmlinux.tmp" \
        && mv "$GUEST_KROOT/vmlinux.tmp" "$GUEST_KROOT/vmlinux"
fi
if [ ! -f "$GUEST_INITRD" ]; then
    "$TESTBED_SCRIPTS/build-initramfs.sh" "$GUEST_KROOT/root" "$GUEST_INITRD"
fi
log "guest ready: kernel $KVER"
