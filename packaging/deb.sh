#!/bin/bash
# packaging/deb.sh [OUT_DIR] - builds the Debian package with cargo-deb (installed with
# `cargo install cargo-deb --locked` if missing) and prints its path on the last line.
# The module's installed path has one setting: the librdma.so asset in Cargo.toml's
# [package.metadata.deb]; the example conf snippet is generated from it.
set -euo pipefail
ROOT=$(dirname "$(readlink -f "$0")")/..
cd "$ROOT"
OUT=${1:-$ROOT/target/debian}
MODULE_PATH=/$(sed -n 's|^ *\["target/release/librdma.so", *"\([^"]*\)".*|\1|p' Cargo.toml)
[ "$MODULE_PATH" != / ] || { echo "deb.sh: no librdma.so asset in Cargo.toml" >&2; exit 1; }
mkdir -p target/deb-assets
sed "s|@MODULE_PATH@|$MODULE_PATH|" packaging/valkey-rdma.conf.in > target/deb-assets/valkey-rdma.conf
# rdma.so, the C module's name, next to librdma.so; the drop-in that loads it
ln -sfn "$(basename "$MODULE_PATH")" target/deb-assets/rdma.so
sed "s|@MODULE_DIR@|$(dirname "$MODULE_PATH")|" packaging/modules-rdma.conf.in > target/deb-assets/rdma.conf
gzip -9n -c packaging/changelog > target/deb-assets/changelog.Debian.gz
for page in packaging/man/*.[17]; do gzip -9n -c "$page" > "target/deb-assets/$(basename "$page").gz"; done
if ! command -v cargo-deb > /dev/null; then
    echo "deb.sh: installing cargo-deb from crates.io" >&2
    cargo install cargo-deb --locked >&2
fi
cargo build --release >&2
cargo deb --no-build --strip --output "$OUT" >&2
ls -t "$OUT"/valkey-rdma_*.deb | head -n1
