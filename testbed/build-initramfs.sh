#!/bin/bash
# build-initramfs.sh KROOT OUT.cpio.gz - a tiny busybox initramfs: /init (guest-init.sh)
# and the kernel modules to mount the host root over 9p and to run Soft-RoCE.
set -euo pipefail
KROOT=$(readlink -f "${1:?usage: $0 KROOT OUT.cpio.gz}")
OUT=$(readlink -f -m "${2:?usage: $0 KROOT OUT.cpio.gz}")
HERE=$(dirname "$(readlink -f "$0")")
KVER=$(ls "$KROOT/lib/modules" | head -n1)
# Order matters: virtio and 9p first (the host root), then the NICs (virtio_net for
# run-in-vm.sh -w, dummy otherwise; bonding for the address-change case) and RDMA.
MODS="virtio_pci 9pnet_virtio 9p virtio_net crc32_generic crc32-pclmul dummy bonding rdma_rxe ib_uverbs rdma_ucm"
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE"/{bin,sbin,proc,sys,dev,newroot,lib/modules}
cp /bin/busybox "$STAGE/bin/busybox"   # busybox-static: no shared libraries
cp "$HERE/guest-init.sh" "$STAGE/init"
chmod 755 "$STAGE/init" "$STAGE/bin/busybox"
: > "$STAGE/modules.list"
for m in $MODS; do
    deps=$(modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" 2>/dev/null) || { echo "note: $m not in $KVER" >&2; continue; }
    while read -r kind path args; do
        [ "$kind" = insmod ] || continue          # "builtin ..." lines need nothing
        base=$(basename "$path")
        case "$base" in   # busybox insmod cannot read compressed modules
            *.ko.xz)  dst=${base%.xz};  xz -dc "$path" > "$STAGE/lib/modules/$dst" ;;
            *.ko.zst) dst=${base%.zst}; zstd -qdc "$path" > "$STAGE/lib/modules/$dst" ;;
            *.ko.gz)  dst=${base%.gz};  gzip -dc "$path" > "$STAGE/lib/modules/$dst" ;;
            *)        dst=$base;        cp "$path" "$STAGE/lib/modules/$dst" ;;
        esac
        grep -q "^$dst\( \|$\)" "$STAGE/modules.list" || echo "$dst $args" >> "$STAGE/modules.list"
    done <<< "$deps"
done
echo "$KVER" > "$STAGE/kver"
( cd "$STAGE" && find . -print0 | cpio --null -o -H newc --quiet ) | gzip -1 > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "testbed: wrote $OUT ($(du -h "$OUT" | cut -f1)), kernel $KVER, $(wc -l < "$STAGE/modules.list") modules" >&2
