#!/bin/bash
# The 1 MB row as --bench now runs it (GETs read the values: -r 2; one warm-up pipeline
# per connection), 5 rounds ABBA: the C module against ours, then the build before the
# write chains (as "C module") against ours. Run in the guest with OLD and NEW set.
export E2E_WORK=$PWD
. /work/main/tests/e2e/lib.sh
B=/work/main/target/release/valkey-rdma-bench
S=$VALKEY_912/src/valkey-server
C=$VALKEY_912/src/valkey-rdma.so
row() { "$B" --compare --server "$S" --rounds 5 -h "$RDMA_ADDR" -q --warmup 1 -c 2 -P 1 -t set,get -d 1048576 -r 2 -n 200 "$@"; }
echo "#### C module against ours (write chains)"
row -p 7800 --c-module "$C" --our-module "$NEW" --latency-trace "$WORK/c-vs-new"
echo "#### ours before the write chains (in the C module's column) against ours"
row -p 7900 --c-module "$OLD" --our-module "$NEW"
