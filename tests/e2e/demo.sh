#!/bin/bash
# demo.sh - the main job, visibly: valkey-server with librdma.so serving real RDMA
# clients (valkey-cli --rdma, upstream rdma-test, valkey-benchmark --rdma, our own
# valkey-rdma-cli), with TCP on the same port. Runs where RDMA is (RDMA_ADDR set).
. "$(dirname "$(readlink -f "$0")")/lib.sh"
set -e
RCLI=$PROJECT_ROOT/target/release/valkey-rdma-cli
step() { echo; echo "\$ $*"; "$@"; }
echo "RDMA device(s): $(ls /sys/class/infiniband | tr '\n' ' ')   address: $RDMA_ADDR"
start_server demo "$VALKEY_912/src/valkey-server" --loadmodule "$OUR_MODULE" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@
echo "valkey-server 9.1.2 started with --loadmodule librdma.so --rdma-bind $RDMA_ADDR --rdma-port $PORT"
grep -E "rdma|RDMA" "$SERVER_LOG" | sed 's/^/  log: /'
step "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING
step "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" SET greeting "hello over RDMA"
step "$CLI912" -h "$RDMA_ADDR" -p "$PORT" GET greeting
step "$RCLI" -h "$RDMA_ADDR" -p "$PORT" --no-raw INCR visits
step "$CLI912" -h "$RDMA_ADDR" -p "$PORT" INFO server | grep -E "valkey_version|listener"
echo; echo "\$ tests/rdma/rdma-test -h $RDMA_ADDR -p $PORT --thread 4"
"$VALKEY_912/tests/rdma/rdma-test" -h "$RDMA_ADDR" -p "$PORT" --thread 4 2>&1 | tail -n 1
echo; echo "\$ valkey-benchmark --rdma -t set,get -n 20000 -c 8 -q   (then the same over TCP)"
"$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -t set,get -n 20000 -c 8 -q 2>&1 | tr '\r' '\n' | grep "per second" | sed 's/^/  RDMA /'
"$BENCH912" -h "$RDMA_ADDR" -p "$PORT" -t set,get -n 20000 -c 8 -q 2>&1 | tr '\r' '\n' | grep "per second" | sed 's/^/  TCP  /'
echo; echo "connected clients over the run: $("$CLI912" -p "$PORT" INFO stats | tr -d '\r' | sed -n 's/^total_connections_received://p'); server alive: $(server_alive && echo yes)"
stop_all_servers
