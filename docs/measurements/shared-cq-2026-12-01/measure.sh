#!/bin/bash
# shared CQ: ours (shared CQ) against the C module, and against ours before (main), ABBA
export E2E_WORK=$PWD
. /tmp/wt-scq/tests/e2e/lib.sh
B=/tmp/wt-scq/target/release/valkey-rdma-bench
S=$VALKEY_912/src/valkey-server
C=$VALKEY_912/src/valkey-rdma.so
NEW=/tmp/wt-scq/target/release/librdma.so
OLD=/tmp/main-before-scq.so
port=7100
cmp() {  # C_OR_OLD ROUNDS ARGS
    local base=$1 rounds=$2; shift 2
    echo "== base $(basename "$base") vs shared CQ: $*"
    timeout 900 "$B" --compare --server "$S" --c-module "$base" --our-module "$NEW" -h "$RDMA_ADDR" -p $port -q \
        --rounds "$rounds" "$@" -t set,get -d 64 2>&1 | tail -n 7
    port=$((port + 50))
}
cmp "$C" 5 -c 32 -P 1 -n 20000
cmp "$C" 5 -c 32 -P 16 -n 100000
cmp "$OLD" 3 -c 32 -P 1 -n 20000
cmp "$OLD" 3 -c 32 -P 16 -n 100000
if command -v strace > /dev/null; then
    for m in "$C" "$OLD" "$NEW"; do
        start_server "st$port" "$S" --loadmodule "$m" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ > /dev/null || continue
        strace -c -f -p "$SERVER_PID" -o "$WORK/strace-$port.txt" & sp=$!
        sleep 1
        "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -c 8 -n 20000 -t set -q | tail -n 1
        kill -INT $sp; wait $sp
        echo "== strace -c, 20000 SET -c 8 -P 1, module $m"
        grep -E 'calls|read$|ioctl|write$|epoll_wait|clock|total' "$WORK/strace-$port.txt"
        stop_all_servers; port=$((port + 50))
    done
fi
