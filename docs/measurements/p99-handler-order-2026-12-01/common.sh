# Sourced by the scripts here (which ran from /tmp/prof inside the guest, through
# `./runtest-rdma --vm`): the e2e helpers, the bench client and the two server modules.
export E2E_WORK=$PWD
. /work/main/tests/e2e/lib.sh
B=/work/main/target/release/valkey-rdma-bench
S=$VALKEY_912/src/valkey-server
C=$VALKEY_912/src/valkey-rdma.so
mkdir -p "$PWD/tr"
