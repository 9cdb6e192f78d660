# bridge.sh - end-to-end cases for valkey-rdma-bridge (sourced by suite.sh after lib.sh):
# TCP-only clients (valkey-cli, valkey-benchmark without --rdma) through the bridge to a
# real 9.1.2 valkey-server serving RDMA with librdma.so, on real verbs.

bridge_alive() { [ -n "$BRIDGE_PID" ] && kill -0 "$BRIDGE_PID" 2>/dev/null || fail "the bridge died"; }

# with_bridge FUNCTION [ARGS...]: runs a case, then stops its bridge and shows its log.
with_bridge() {
    "$@"; local rc=$?
    if [ -n "$BRIDGE_LOG" ] && [ -s "$BRIDGE_LOG" ]; then sed 's/^/# bridge: /' "$BRIDGE_LOG" | tail -n 8; fi
    stop_bridge
    BRIDGE_LOG=""
    return $rc
}

# connected_clients: as the server counts them (asked over direct TCP: this asker is one).
connected_clients() {
    "$CLI912" -h 127.0.0.1 -p "$PORT" INFO clients | tr -d '\r' | sed -n 's/^connected_clients://p'
}

# clients_drop_to N SECS: waits until connected_clients is N.
clients_drop_to() {
    local want=$1 secs=$2 n i
    for i in $(seq 1 $((secs * 5))); do
        n=$(connected_clients)
        [ "$n" = "$want" ] && return 0
        sleep 0.2
    done
    fail "connected_clients is $n after ${secs} s, want $want (the bridge left RDMA connections open)"
}

elapsed_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }

bridge_server() {  # NAME: a 9.1.2 server with our module, 64 KiB RDMA RX buffers (its stderr to a file)
    start_server "$1" "$VALKEY_912/src/valkey-server" --loadmodule "$OUR_MODULE" --rdma-bind "$RDMA_ADDR" \
        --rdma-port @PORT@ --rdma-rx-size 65536 2>> "$WORK/bridge-servers.stderr"
}

case_bridge_bytes() {  # a 10 MB value and a 20000-element reply through 64 KiB windows, both ways
    bridge_server bbytes || return 1
    start_bridge "$PORT" --rx-size 65536 || return 1
    head -c 7500000 /dev/urandom | base64 -w0 > "$WORK/bridge-big.txt"
    local want got direct
    want=$(md5sum < "$WORK/bridge-big.txt" | cut -d' ' -f1)
    got=$(timeout 120 "$CLI912" -h 127.0.0.1 -p "$BPORT" -x SET bigkey < "$WORK/bridge-big.txt" 2>&1)
    expect_eq "SET -x of 10 MB through the bridge" "$got" OK || return 1
    got=$(timeout 120 "$CLI912" -h 127.0.0.1 -p "$BPORT" GET bigkey 2>&1 | tr -d '\n' | md5sum | cut -d' ' -f1)
    expect_eq "GET through the bridge returns the same bytes" "$got" "$want" || return 1
    direct=$(timeout 120 "$CLI912" -h 127.0.0.1 -p "$PORT" GET bigkey | tr -d '\n' | md5sum | cut -d' ' -f1)
    expect_eq "GET over TCP straight to the server" "$direct" "$want" || return 1
    local elems; readarray -t elems <<< "$(seq -f "element-%05g-$RANDOM$RANDOM" 1 20000)"
    "$CLI912" -h 127.0.0.1 -p "$PORT" RPUSH biglist "${elems[@]}" > "$WORK/rpush.out"
    expect_eq "RPUSH of 20000 elements over TCP" "$(cat "$WORK/rpush.out")" 20000 || return 1
    direct=$(timeout 60 "$CLI912" -h 127.0.0.1 -p "$PORT" LRANGE biglist 0 -1 | md5sum | cut -d' ' -f1)
    timeout 60 "$CLI912" -h 127.0.0.1 -p "$BPORT" LRANGE biglist 0 -1 > "$WORK/lrange-bridge.out" 2>&1
    expect_eq "LRANGE through the bridge: elements" "$(wc -l < "$WORK/lrange-bridge.out")" 20000 || return 1
    expect_eq "LRANGE through the bridge equals LRANGE over TCP (md5)" \
        "$(md5sum < "$WORK/lrange-bridge.out" | cut -d' ' -f1)" "$direct" || return 1
    bridge_alive && server_alive
}

case_bridge_many_connections() {  # valkey-benchmark -c 50 through the bridge; every RDMA connection closed after
    bridge_server bconns || return 1
    start_bridge "$PORT" || return 1
    timeout 300 "$BENCH912" -h 127.0.0.1 -p "$BPORT" -c 50 -n 20000 -t set,get -q > "$WORK/bridge-c50.log" 2>&1
    local t r ok=0
    for t in SET GET; do
        r=$(bench_rps "$WORK/bridge-c50.log" $t); echo "# $t through the bridge, -c 50: ${r:-none} req/s"
        awk -v r="${r:-0}" 'BEGIN { exit !(r > 0) }' || { fail "no rate for $t"; ok=1; }
    done
    [ $ok = 0 ] || { tail -n 5 "$WORK/bridge-c50.log"; return 1; }
    clients_drop_to 1 5 || return 1
    grep -q "RDMA error\|TCP error" "$BRIDGE_LOG" && { fail "the bridge logged errors"; return 1; }
    bridge_alive && server_alive
}

case_bridge_tcp_client_killed() {  # kill -9 of a pipelining TCP client: the bridge lives on, RDMA side closed
    bridge_server bkill || return 1
    start_bridge "$PORT" || return 1
    "$BENCH912" -h 127.0.0.1 -p "$BPORT" -t set -n 10000000 -c 8 -P 16 -q > /dev/null 2>&1 &
    local bp=$! n
    sleep 2
    n=$(connected_clients); echo "# connected_clients while the benchmark runs: $n"
    [ "${n:-0}" -ge 9 ] || { kill -9 $bp; fail "the benchmark's 8 connections did not reach the server"; return 1; }
    kill -9 $bp; wait $bp 2>/dev/null
    clients_drop_to 1 5 || return 1
    bridge_alive || return 1
    expect_eq "a new client through the bridge" "$(timeout 20 "$CLI912" -h 127.0.0.1 -p "$BPORT" PING 2>&1)" PONG || return 1
    expect_eq "the benchmark's SETs reached the server" "$(timeout 20 "$CLI912" -h 127.0.0.1 -p "$BPORT" EXISTS key:__rand_int__ 2>&1)" 1 || return 1
    clients_drop_to 1 5 && server_alive
}

case_bridge_server_closes() {  # CLIENT KILL of the bridged RDMA client ends the blocked TCP client
    bridge_server bsrvclose || return 1
    start_bridge "$PORT" || return 1
    timeout 60 "$CLI912" -h 127.0.0.1 -p "$BPORT" BLPOP nolist 60 > "$WORK/bridge-blpop.out" 2>&1 &
    local cp=$! n i t0
    for i in $(seq 1 50); do [ "$(connected_clients)" = 2 ] && break; sleep 0.1; done
    expect_eq "the BLPOP client is connected through the bridge" "$(connected_clients)" 2 || { kill $cp; return 1; }
    sleep 0.5
    kill -0 $cp 2>/dev/null || { fail "BLPOP ended before CLIENT KILL: $(cat "$WORK/bridge-blpop.out")"; return 1; }
    n=$("$CLI912" -h 127.0.0.1 -p "$PORT" CLIENT KILL TYPE normal SKIPME yes)
    echo "# CLIENT KILL TYPE normal killed $n"
    [ "${n:-0}" -ge 1 ] || { kill $cp; fail "CLIENT KILL found no client"; return 1; }
    t0=$EPOCHREALTIME
    for i in $(seq 1 25); do kill -0 $cp 2>/dev/null || break; sleep 0.2; done
    if kill -0 $cp 2>/dev/null; then kill $cp; fail "the TCP client is still connected 5 s after the server closed"; return 1; fi
    echo "# the TCP client ended $(elapsed_since "$t0") s after CLIENT KILL: $(head -c 200 "$WORK/bridge-blpop.out")"
    grep -q "the server closed the RDMA connection" "$BRIDGE_LOG" || { fail "the bridge did not log the server leaving"; return 1; }
    bridge_alive || return 1
    expect_eq "a new client through the bridge" "$(timeout 20 "$CLI912" -h 127.0.0.1 -p "$BPORT" PING 2>&1)" PONG && server_alive
}

case_bridge_nobody_listens() {  # RDMA connect refused: the TCP client is closed at once, the bridge says why
    local to=$NEXT_PORT out t0 el; NEXT_PORT=$((NEXT_PORT + 1))
    start_bridge "$to" -t 5 || return 1
    t0=$EPOCHREALTIME
    out=$(timeout 20 "$CLI912" -h 127.0.0.1 -p "$BPORT" PING 2>&1)
    el=$(elapsed_since "$t0")
    echo "# valkey-cli through a bridge to a closed port, after $el s: $out"
    [ "$out" != PONG ] || { fail "PONG from nowhere"; return 1; }
    awk -v e="$el" 'BEGIN { exit !(e < 3) }' || { fail "the TCP client waited $el s"; return 1; }
    grep -q "cannot connect to $RDMA_ADDR:$to over RDMA" "$BRIDGE_LOG" || { fail "the bridge did not log why"; return 1; }
    bridge_alive
}

run_case "bridge: 10 MB value and 20000-element LRANGE through the bridge, md5 equal" with_bridge case_bridge_bytes
run_case "bridge: valkey-benchmark -c 50 through the bridge, RDMA connections closed after" with_bridge case_bridge_many_connections
run_case "bridge: TCP client killed mid-stream" with_bridge case_bridge_tcp_client_killed
run_case "bridge: server closes (CLIENT KILL) while the TCP client blocks in BLPOP" with_bridge case_bridge_server_closes
run_case "bridge: RDMA connect refused (nobody listens)" with_bridge case_bridge_nobody_listens
