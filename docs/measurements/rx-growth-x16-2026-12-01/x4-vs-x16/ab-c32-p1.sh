#!/bin/bash
# A/B at c32 P1: the x4 build ("C module" slot) against the x16 build ("ours")
V=/root/.cache/valkey-rdma-testbed/valkey-9.1.2/src/valkey-server
B=/work/main/target/release/valkey-rdma-bench
"$B" --compare --server "$V" --c-module /tmp/ab/cur.so --our-module /tmp/ab/x16b.so -h "$RDMA_ADDR" -p 7600 -q --warmup 1 --rounds 4 -t set,get -d 64 -c 32 -P 1 -n 40000 --latency-trace "$PWD/c32-p1" --json "$PWD/c32-p1.json" | tee "$PWD/c32-p1.txt"
