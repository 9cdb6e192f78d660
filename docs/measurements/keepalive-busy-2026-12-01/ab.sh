#!/bin/bash
# the keepalive skipped for busy connections (new) against 048f432 (old), and against the C module
export E2E_WORK=$PWD
. /work/main/tests/e2e/lib.sh
B=/tmp/bench-clone/target/release/valkey-rdma-bench
S=$VALKEY_912/src/valkey-server
echo "### new (our-module) vs old (as c-module), c32 P1"
timeout 1200 "$B" --compare --server "$S" --c-module /tmp/ab-ka/old.so --our-module /tmp/ab-ka/new.so \
   -h "$RDMA_ADDR" -p 7500 -q --warmup 1 --rounds 4 -c 32 -P 1 -t set,get -d 64 -n 40000 --latency-trace $PWD/ka 2>&1 | grep -v '^ *[0-9]* requests' | tail -n 16
for f in ka*new*.tsv ka*ours*.tsv; do [ -f "$f" ] && python3 /work/main/docs/measurements/p99-handler-order-2026-12-01/clusters.py "$f" 2>/dev/null | awk '/p99/ || $5 >= 20'; done
