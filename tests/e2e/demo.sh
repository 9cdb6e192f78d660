#!/bin/bash
# demo.sh - the main job, visibly: valkey-server with librdma.so serving real RDMA
# clients (valkey-cli --rdma, upstream rdma-test, valkey-benchmark --rdma, our own
# valkey-rdma-cli), with TCP on the same port. Runs where RDMA is (RDMA_ADDR set).
# Every step checks its own outcome; the last line says whether the demo worked and the
# exit status agrees: 0 only when every step succeeded.
. "$(dirname "$(readlink -f "$0")")/lib.sh"
RCLI=$PROJECT_ROOT/target/release/valkey-rdma-cli
BROKEN=()

# step WANT CMD...: prints the command and its output; the step succeeds when the
# command exits 0 and its output (without carriage returns) contains WANT.
step() {
    local want=$1 out rc; shift
    echo; echo "\$ ${*##*/}"
    out=$("$@" 2>&1); rc=$?
    echo "$out" | sed 's/^/  /'
    if [ $rc != 0 ] || [[ "$(echo "$out" | tr -d '\r')" != *"$want"* ]]; then
        echo "  ^ FAILED: expected exit 0 and output containing '$want' (exit $rc)"
        BROKEN+=("${*##*/}")
    fi
}
finish() {
    stop_all_servers
    echo
    if [ ${#BROKEN[@]} = 0 ]; then
        echo "demo: OK - every step succeeded"; exit 0
    fi
    echo "demo: FAILED - ${#BROKEN[@]} step(s) did not succeed:"; printf '  %s\n' "${BROKEN[@]}"; exit 1
}

echo "RDMA device(s): $(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ')   address: $RDMA_ADDR"
if ! start_server demo "$VALKEY_912/src/valkey-server" --loadmodule "$OUR_MODULE" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@; then
    BROKEN+=("valkey-server 9.1.2 --loadmodule $OUR_MODULE"); finish
fi
echo "valkey-server 9.1.2 started with --loadmodule librdma.so --rdma-bind $RDMA_ADDR --rdma-port $PORT"
grep -E "rdma|RDMA" "$SERVER_LOG" | sed 's/^/  log: /'
step PONG "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING
step OK "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" SET greeting "hello over RDMA"
step "hello over RDMA" "$CLI912" -h "$RDMA_ADDR" -p "$PORT" GET greeting
step "(integer) 1" "$RCLI" -h "$RDMA_ADDR" -p "$PORT" --no-raw INCR visits
readarray -t ELEMS <<< "$(seq 1 20000)"
"$CLI912" -p "$PORT" RPUSH demo:list "${ELEMS[@]}" > /dev/null
step "20000" bash -c "'$RCLI' -h '$RDMA_ADDR' -p '$PORT' LRANGE demo:list 0 -1 | tail -n 1"
step "name=rdma,bind=$RDMA_ADDR" "$CLI912" -h "$RDMA_ADDR" -p "$PORT" INFO server
step "Valkey Over RDMA test [OK]" "$VALKEY_912/tests/rdma/rdma-test" -h "$RDMA_ADDR" -p "$PORT" --thread 4
echo; echo "valkey-benchmark -t set,get -n 20000 -c 8 -q, over RDMA and then over TCP:"
step "GET: " "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -t set,get -n 20000 -c 8 -q
step "GET: " "$BENCH912" -h "$RDMA_ADDR" -p "$PORT" -t set,get -n 20000 -c 8 -q
echo; echo "connections received over the run: $("$CLI912" -p "$PORT" INFO stats | tr -d '\r' | sed -n 's/^total_connections_received://p')"
server_alive && echo "server alive: yes" || { echo "server alive: NO"; BROKEN+=("the server died"); }
finish
