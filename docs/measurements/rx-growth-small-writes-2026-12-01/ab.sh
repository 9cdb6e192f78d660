#!/bin/bash
# RX buffer grown only for clients that fill it in at most 128 writes (new) against de6ec3d (old,
# grown for every client that writes half of 64 KiB): c32 P1, latency traces of every request
export E2E_WORK=$PWD
. /work/main/tests/e2e/lib.sh
B=/work/main/target/release/valkey-rdma-bench
S=$VALKEY_912/src/valkey-server
echo "### new (our-module) vs old (as c-module), c32 P1"
timeout 1500 "$B" --compare --server "$S" --c-module /tmp/ab-gw/old.so --our-module /tmp/ab-gw/new.so \
   -h "$RDMA_ADDR" -p 7600 -q --warmup 1 --rounds 4 -c 32 -P 1 -t set,get -d 64 -n 40000 --latency-trace $PWD/gw 2>&1 | grep -v '^ *[0-9]* requests' | tail -n 16
for f in gw*.tsv; do python3 /work/main/docs/measurements/p99-handler-order-2026-12-01/clusters.py "$f" 2>/dev/null | awk '/p99/ || $5 >= 20 || /before \[6[34]/'; done
