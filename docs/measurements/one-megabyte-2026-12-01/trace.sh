#!/bin/bash
# The 1 MB row with every pipeline traced: which requests are the slow ones (the first
# of each connection?). C module against a build of ours, ABBA. Run in the guest.
export E2E_WORK=$PWD
. /work/main/tests/e2e/lib.sh
B=/work/main/target/release/valkey-rdma-bench
S=$VALKEY_912/src/valkey-server
C=$VALKEY_912/src/valkey-rdma.so
OURS=$1 ROUNDS=${ROUNDS:-2} KEYS=${KEYS:-10000} N=${REQUESTS:-400}
"$B" --compare --server "$S" --c-module "$C" --our-module "$OURS" --rounds "$ROUNDS" -h "$RDMA_ADDR" -p 7700 \
  -c 2 -P 1 -t set,get -d 1048576 -r "$KEYS" -n "$N" --latency-trace "$WORK/tr" 2>&1 | grep -v "^ *round\|^ *TCP"
for f in "$WORK"/tr-*.tsv; do
  echo "== $(basename "$f"): the 6 slowest (connection, start ms, latency ms, bytes sent before), and the"
  echo "   median latency of each connection's first 3 requests against the rest"
  sort -t$'\t' -k3,3nr "$f" | grep -v '^connection' | head -6 | awk -F'\t' '{printf "   c%s  %7.1f  %6.1f  %9d\n", $1, $2/1000, $3/1000, $4}'
  awk -F'\t' 'NR > 1 { n[$1]++; if (n[$1] <= 3) first = first " " $3 / 1000; else rest[++r] = $3 / 1000 }
    END { asort(rest); printf "   first 3 of each connection (ms):%s; the rest: median %.1f, p99 %.1f (%d)\n", first, rest[int(r / 2) + 1], rest[int(r * 0.99) + 1], r }' "$f"
done
