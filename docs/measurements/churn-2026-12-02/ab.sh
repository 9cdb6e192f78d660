#!/bin/bash
# ab.sh ROUNDS BUILD...: connection churn (`valkey-benchmark --rdma -k 0`, a new connection
# per request, the --bench row) on the 9.1.2 server with the C module and with builds of
# ours (/tmp/ab/librdma-BUILD.so), a fresh server per run, the order rotating each round.
# NO_C=1 leaves the C module out. Runs in the guest (from its writable run folder), e.g.:
#   testbed/run-in-vm.sh -t 1800 -- 'NO_C=1 bash /work/main/docs/measurements/churn-2026-12-02/ab.sh 4 377e274 26fdd20'
export E2E_WORK=$PWD
. /work/main/tests/e2e/lib.sh
. /work/main/docs/measurements/rotate.sh
ROUNDS=${1:-4}; shift
modules "$@"
for round in $(seq 1 "$ROUNDS"); do
  for m in $(rotation "$round"); do
    tag=$(basename "$m" .so)
    start_server "churn-$tag-$round" "$VALKEY_912/src/valkey-server" --loadmodule "$m" \
        --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ > /dev/null || { echo "no server"; continue; }
    timeout 600 "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -k 0 -c 4 -n 900 -t ping_inline -q > "$PWD/churn-$tag-$round.log" 2>&1
    echo "round $round $tag: $(bench_rps "$PWD/churn-$tag-$round.log" PING_INLINE) req/s"
    stop_all_servers
  done
done
