#!/bin/bash
. "$(dirname "$0")/common.sh"
NEW=/work/main/target/release/librdma.so
timeout 900 "$B" --compare --server "$S" --c-module "$C" --our-module "$NEW" -h "$RDMA_ADDR" -p 7500 -q \
   --rounds 4 -c 8 -P 16 -t set,get -d 64 -n 200000 --latency-trace $PWD/tr/c8p16 2>&1 | tail -n 12
