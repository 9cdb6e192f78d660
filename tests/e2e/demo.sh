#!/bin/bash
# demo.sh - the main job, visibly: valkey-server with librdma.so serving real RDMA
# clients (valkey-cli --rdma, upstream rdma-test, valkey-benchmark --rdma, our own
# valkey-rdma-cli), with TCP on the same port. Runs where RDMA is (RDMA_ADDR set).
# Every step checks its own outcome; the last line says whether the demo worked and the
# exit status agrees: 0 only when every step succeeded.
. "$(dirname "$(readlink -f "$0")")/lib.sh"
RCLI=$PROJECT_ROOT/target/release/valkey-rdma-cli
BROKEN=()

# step WHAT WANT CMD...: runs CMD; one line: "ok  WHAT: <the output line with WANT>", or
# "FAILED WHAT" with the exit status and the last lines of the output. The step succeeds
# when CMD exits 0 and its output (carriage-return progress lines split) contains WANT.
step() {
    local what=$1 want=$2 out rc line; shift 2
    out=$("$@" 2>&1 | tr '\r' '\n'); rc=$?
    line=$(grep -F -m1 -- "$want" <<< "$out" | sed 's/^ *//' | cut -c1-90)
    if [ $rc = 0 ] && [ -n "$line" ]; then
        printf '  ok      %-44s %s\n' "$what" "$line"
    else
        printf '  FAILED  %-44s (exit %s; wanted output with "%s"); last lines:\n' "$what" "$rc" "$want"
        grep -v '^ *$' <<< "$out" | tail -n 3 | sed 's/^/            /'
        BROKEN+=("$what")
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

echo "RDMA device(s): $(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ')  address: $RDMA_ADDR"
if ! start_server demo "$VALKEY_912/src/valkey-server" --loadmodule "$OUR_MODULE" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@; then
    BROKEN+=("valkey-server 9.1.2 --loadmodule $OUR_MODULE"); finish
fi
echo "valkey-server 9.1.2 --loadmodule librdma.so --rdma-bind $RDMA_ADDR --rdma-port $PORT (TCP on the same port)"
grep -E "RDMA: (connection type|listening)" "$SERVER_LOG" | sed 's/^[0-9]*:[A-Z] /  log: /'
echo
step "PING over RDMA (valkey-cli --rdma)" PONG "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING
step "SET over RDMA" OK "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" SET greeting "hello over RDMA"
step "GET of the same key over TCP" "hello over RDMA" "$CLI912" -h "$RDMA_ADDR" -p "$PORT" GET greeting
step "INCR with our valkey-rdma-cli" "(integer) 1" "$RCLI" -h "$RDMA_ADDR" -p "$PORT" --no-raw INCR visits
readarray -t ELEMS <<< "$(seq 1 20000)"
"$CLI912" -p "$PORT" RPUSH demo:list "${ELEMS[@]}" > /dev/null
step "LRANGE of 20,000 elements (a multi-block reply)" "20000" bash -c "'$RCLI' -h '$RDMA_ADDR' -p '$PORT' LRANGE demo:list 0 -1 | tail -n 1"
step "INFO server lists the RDMA listener" "name=rdma,bind=$RDMA_ADDR" "$CLI912" -h "$RDMA_ADDR" -p "$PORT" INFO server
step "upstream rdma-test --thread 4" "Valkey Over RDMA test [OK]" "$VALKEY_912/tests/rdma/rdma-test" -h "$RDMA_ADDR" -p "$PORT" --thread 4
step "valkey-benchmark --rdma -t set,get -c 8" "GET: " bash -o pipefail -c "'$BENCH912' --rdma -h '$RDMA_ADDR' -p '$PORT' -t set,get -n 20000 -c 8 -q | tee '$WORK/demo-rdma.log'"
step "valkey-benchmark (TCP) -t set,get -c 8" "GET: " bash -o pipefail -c "'$BENCH912' -h '$RDMA_ADDR' -p '$PORT' -t set,get -n 20000 -c 8 -q | tee '$WORK/demo-tcp.log'"
echo
echo "  valkey-benchmark -n 20000 -c 8, requests per second:"
printf '    %-6s %12s %12s\n' "" "over RDMA" "over TCP"
for t in SET GET; do
    printf '    %-6s %12s %12s\n' "$t" "$(bench_rps "$WORK/demo-rdma.log" $t)" "$(bench_rps "$WORK/demo-tcp.log" $t)"
done
echo
echo "  connections received over the run: $("$CLI912" -p "$PORT" INFO stats | tr -d '\r' | sed -n 's/^total_connections_received://p')"
if server_alive; then echo "  ok      the server is alive and answering"; else echo "  FAILED  the server died"; BROKEN+=("the server died"); fi
finish
