#!/bin/bash
# 8 MB SET/GET: C module at rdma-rx-size 1 MiB (its default) and 16 MiB, ours at 16 MiB
# (its window starts at 64 KiB and grows to the cap only for a client that fills it).
V=/root/.cache/valkey-rdma-testbed/valkey-9.1.2/src
B=/work/main/target/release/valkey-rdma-bench
OURS=/work/main/target/release/librdma.so
P=7300
one() {  # LABEL MODULE RX
  local d; d=$(mktemp -d "$PWD/srv.XXXX")
  "$V/valkey-server" --port $P --bind "$RDMA_ADDR" 127.0.0.1 --protected-mode no --save "" --dir "$d" \
     --logfile "$d/log" --loadmodule "$2" --rdma-bind "$RDMA_ADDR" --rdma-port $P --rdma-rx-size "$3" </dev/null &
  local pid=$!
  for i in $(seq 50); do "$V/valkey-cli" -p $P PING >/dev/null 2>&1 && break; sleep 0.2; done
  echo "## $1 round $r"
  "$B" -h "$RDMA_ADDR" -p $P -c 1 -P 1 -t set,get -d 8388608 -r 2 -n 40 --warmup 1 --server-pid $pid 2>&1 | grep -E 'req/s|CPU|SET|GET' | head -8
  echo "# VmPin after: $(grep VmPin /proc/$pid/status)"
  kill $pid; wait $pid 2>/dev/null; P=$((P+1))
}
for r in 1 2 3 4; do
  if [ $((r % 2)) = 1 ]; then
    one "C 1MiB" $V/valkey-rdma.so 1048576; one "ours 16MiB" $OURS 16777216; one "C 16MiB" $V/valkey-rdma.so 16777216
  else
    one "C 16MiB" $V/valkey-rdma.so 16777216; one "ours 16MiB" $OURS 16777216; one "C 1MiB" $V/valkey-rdma.so 1048576
  fi
done
