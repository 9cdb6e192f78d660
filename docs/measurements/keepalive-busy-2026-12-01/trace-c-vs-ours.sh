#!/bin/bash
# c32 P1 latency traces of both modules, 2 rounds ABBA (run in the guest from its run folder)
export E2E_WORK=$PWD
. /work/main/tests/e2e/lib.sh
B=/tmp/bench-clone/target/release/valkey-rdma-bench
S=$VALKEY_912/src/valkey-server
C=$VALKEY_912/src/valkey-rdma.so
mkdir -p "$PWD/tr"
timeout 900 "$B" --compare --server "$S" --c-module "$C" --our-module /tmp/bench-clone/target/release/librdma.so \
   -h "$RDMA_ADDR" -p 7500 -q --warmup 1 --rounds 2 -c 32 -P 1 -t set,get -d 64 -n 40000 --latency-trace $PWD/tr/c32p1 2>&1 | tail -n 12
ls -la tr/
for f in tr/*; do python3 /work/main/docs/measurements/p99-handler-order-2026-12-01/clusters.py "$f"; done
