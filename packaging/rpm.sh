#!/bin/bash
# packaging/rpm.sh [OUT_DIR] - builds the RPM (Fedora/RHEL layout) with cargo-generate-rpm
# (installed with `cargo install cargo-generate-rpm --locked` if missing) and prints its
# path on the last line. The assets are listed in Cargo.toml's
# [package.metadata.generate-rpm]; the manual pages are compressed by packaging/deb.sh's
# rules, shared here.
set -euo pipefail
ROOT=$(dirname "$(readlink -f "$0")")/..
cd "$ROOT"
OUT=${1:-$ROOT/target/generate-rpm}
MODULE_DIR=/usr/lib64/valkey/modules
if ! command -v cargo-generate-rpm > /dev/null; then
    echo "rpm.sh: installing cargo-generate-rpm from crates.io" >&2
    cargo install cargo-generate-rpm --locked >&2
fi
cargo build --release >&2
mkdir -p target/rpm-assets target/deb-assets
for f in librdma.so valkey-rdma-cli valkey-rdma-bench valkey-rdma-bridge; do
    strip --strip-unneeded -o "target/rpm-assets/$f" "target/release/$f"
done
sed "s|@MODULE_DIR@|$MODULE_DIR|" packaging/modules-rdma.conf.in > target/rpm-assets/rdma.conf
for page in packaging/man/*.[17]; do gzip -9n -c "$page" > "target/deb-assets/$(basename "$page").gz"; done
mkdir -p "$OUT"
cargo generate-rpm --output "$OUT" >&2
ls -t "$OUT"/valkey-rdma-*.rpm | head -n1
