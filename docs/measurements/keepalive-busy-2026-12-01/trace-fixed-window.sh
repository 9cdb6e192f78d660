#!/bin/bash
# c32 P1 latency traces: ours with the growing window (default) and ours with the window fixed at 64 KiB
V=/root/.cache/valkey-rdma-testbed/valkey-9.1.2/src
B=/tmp/bench-clone/target/release/valkey-rdma-bench
OURS=/tmp/bench-clone/target/release/librdma.so
P=7300
one() {  # LABEL RX
  local d; d=$(mktemp -d "$PWD/srv.XXXX")
  "$V/valkey-server" --port $P --bind "$RDMA_ADDR" 127.0.0.1 --protected-mode no --save "" --dir "$d" \
     --logfile "$d/log" --loadmodule "$OURS" --rdma-bind "$RDMA_ADDR" --rdma-port $P --rdma-rx-size "$2" </dev/null &
  local pid=$!
  for i in $(seq 50); do "$V/valkey-cli" -p $P PING >/dev/null 2>&1 && break; sleep 0.2; done
  echo "## $1 round $r"
  "$B" -h "$RDMA_ADDR" -p $P -c 32 -P 1 -t set,get -d 64 -n 40000 --warmup 1 --server-pid $pid --latency-trace "$PWD/$1-$r" 2>&1 | grep -E 'req/s|CPU' | head -4
  "$V/valkey-cli" -p $P INFO rdma | tr -d '\r' | grep -E 'rx_grow|growth|pinned' | head -4
  kill $pid; wait $pid 2>/dev/null; P=$((P+1))
  python3 /work/main/docs/measurements/p99-handler-order-2026-12-01/clusters.py "$PWD/$1-$r".tsv 2>/dev/null | awk '/p99/ || $5 >= 10 || $9+0 >= 90'
}
for r in 1 2; do
  if [ $r = 1 ]; then one grow 1048576; one fixed64k 65536; else one fixed64k 65536; one grow 1048576; fi
done
