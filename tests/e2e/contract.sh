# contract.sh - what Valkey's core does with a connection, and what one client can do to
# the others (sourced by suite.sh --impl ours, after ours.sh). docs/server-abi.md §4.6
# says how the module answers each.

# expect_serving WHAT: a TCP client and two new RDMA clients (upstream's and ours) are
# answered within 20 s each.
expect_serving() {
    expect_eq "$1: PING over TCP" "$(timeout 20 "$CLI912" -h 127.0.0.1 -p "$PORT" PING 2>&1)" PONG || return 1
    expect_eq "$1: PING over RDMA (valkey-cli)" "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING 2>&1)" PONG || return 1
    expect_eq "$1: PING over RDMA (ours)" "$(timeout 20 "$RDMA_CLI" -h "$RDMA_ADDR" -p "$PORT" PING 2>&1)" PONG
}

# expect_sigterm_stops: SIGTERM ends the server within 30 s (a hung event loop never does).
expect_sigterm_stops() {
    kill -TERM "$SERVER_PID"
    local i
    for i in $(seq 1 150); do kill -0 "$SERVER_PID" 2>/dev/null || return 0; sleep 0.2; done
    fail "the server did not stop within 30 s of SIGTERM"
}

case_script_debug_forked() {  # valkey-cli --rdma --ldb: the forked debugger cannot use RDMA; the client is closed, the rest served
    start_server ldb "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    # busy RDMA clients on the same shared completion queue as the debugging one
    "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -c 4 -n 40000 -t ping_mbulk -q > "$WORK/ldb-bench.log" 2>&1 &
    local bp=$!
    sleep 2
    printf 'local x = 1\nreturn x + 1\n' > "$WORK/ldb.lua"
    local out; out=$(timeout 30 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" --ldb --eval "$WORK/ldb.lua" < /dev/null 2>&1)
    echo "# valkey-cli --rdma --ldb: $(echo "$out" | tr '\n' ' ' | cut -c1-160)"
    grep -q "forked for debugging eval" "$SERVER_LOG" || { fail "no debugger child was forked"; return 1; }
    expect_serving "after the forked debugger" || return 1
    wait $bp; local rc=$?
    local r; r=$(bench_rps "$WORK/ldb-bench.log" PING_MBULK); echo "# the other RDMA clients meanwhile: ${r:-none} req/s (exit $rc)"
    [ $rc = 0 ] && awk -v r="${r:-0}" 'BEGIN { exit !(r > 0) }' || { fail "the other RDMA clients were cut off"; return 1; }
    expect_sigterm_stops
}
run_case "ours SCRIPT DEBUG YES (forked debugger) over RDMA: the server keeps serving everyone and stops on SIGTERM" case_script_debug_forked

case_script_debug_sync() {  # SCRIPT DEBUG SYNC over RDMA: the script runs to its end, the reply arrives, the server serves on
    start_server ldbsync "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    printf 'local x = 20\nreturn x + 22\n' > "$WORK/ldbsync.lua"
    local out; out=$(timeout 30 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" --ldb-sync-mode --eval "$WORK/ldbsync.lua" < /dev/null 2>&1)
    echo "# valkey-cli --rdma --ldb-sync-mode: $(echo "$out" | tr '\n' ' ' | cut -c1-200)"
    grep -q "synchronous debugging eval session ended" "$SERVER_LOG" || { fail "the synchronous session did not end"; return 1; }
    expect_serving "after the synchronous debugger" || return 1
    expect_sigterm_stops
}
run_case "ours SCRIPT DEBUG SYNC over RDMA: the session ends, the server keeps serving" case_script_debug_sync

case_module_unload_refused() {  # MODULE UNLOAD rdma is refused with a reason; RDMA keeps serving
    start_server unload "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ --enable-module-command yes || return 1
    local out; out=$("$CLI912" -h 127.0.0.1 -p "$PORT" MODULE UNLOAD rdma 2>&1); echo "# MODULE UNLOAD rdma: $out"
    case "$out" in *ERR*) ;; *) fail "MODULE UNLOAD rdma was not refused"; return 1 ;; esac
    grep "cannot be unloaded" "$SERVER_LOG" | sed 's/^/# log: /'
    grep -q "RDMA: .*cannot be unloaded" "$SERVER_LOG" || { fail "no log line saying why"; return 1; }
    "$CLI912" -h 127.0.0.1 -p "$PORT" MODULE LIST | grep -qx rdma || { fail "MODULE LIST no longer lists rdma"; return 1; }
    expect_serving "after MODULE UNLOAD" || return 1
    expect_sigterm_stops
}
run_case "ours MODULE UNLOAD is refused with a reason, RDMA keeps serving" case_module_unload_refused

case_port_zero_under_load() {  # CONFIG SET rdma-port 0 while clients run on accepted connections: they finish
    start_server portzero "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    # one test (-t set): valkey-benchmark keeps its connections for the whole test
    timeout 120 "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -t set -n 40000 -c 4 -q > "$WORK/portzero.log" 2>&1 &
    local bp=$!
    sleep 3
    expect_eq "CONFIG SET rdma-port 0 under load" "$("$CLI912" -h 127.0.0.1 -p "$PORT" config set rdma-port 0)" OK || { kill -9 $bp; return 1; }
    wait $bp; local rc=$?
    tr '\r' '\n' < "$WORK/portzero.log" | grep -v "^ *$" | tail -n 2 | sed 's/^/# bench: /'
    if [ $rc != 0 ]; then
        "$CLI912" -h 127.0.0.1 -p "$PORT" CLIENT LIST | sed 's/^/# client: /'
        "$CLI912" -h 127.0.0.1 -p "$PORT" INFO rdma | tr -d '\r' | grep -E "^rdma_(connected|pending|errors|cm_)" | sed 's/^/# /'
        tail -n 5 "$SERVER_LOG" | sed 's/^/# log: /'
    fi
    expect_eq "valkey-benchmark's exit status" "$rc" 0 || return 1
    local r; r=$(bench_rps "$WORK/portzero.log" SET); echo "# SET, the listener closed 3 s in: ${r:-none} req/s"
    awk -v r="${r:-0}" 'BEGIN { exit !(r > 0) }' || { fail "no SET rate: the accepted clients were cut off"; return 1; }
    if timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING 2>/dev/null | grep -q PONG; then fail "still accepting after rdma-port 0"; return 1; fi
    server_alive
}
run_case "ours CONFIG SET rdma-port 0 leaves accepted clients alone" case_port_zero_under_load

case_killed_mid_pipeline() {  # io-threads 4, 50 clients pipelining 4 KiB SETs, SIGKILLed (3 rounds): all closed
    start_server killpipe "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ --io-threads 4 || return 1
    local round bp i n t0
    for round in 1 2 3; do
        "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -c 50 -P 4 -d 4096 -n 100000000 -t set -q > /dev/null 2>&1 &
        bp=$!
        for i in $(seq 1 100); do [ "$(rdma_info connected_clients)" = 50 ] && break; sleep 0.2; done
        expect_eq "round $round: RDMA clients before the kill" "$(rdma_info connected_clients)" 50 || { kill -9 $bp; return 1; }
        sleep "$round"
        kill -9 $bp; wait $bp 2>/dev/null; t0=$SECONDS
        for i in $(seq 1 150); do n=$(rdma_info connected_clients); [ "$n" = 0 ] && break; sleep 0.2; done
        echo "# round $round: 50 pipelining connections of a client SIGKILLed after ${round} s: $n left after $((SECONDS - t0)) s"
        if [ "$n" != 0 ]; then
            "$CLI912" -h 127.0.0.1 -p "$PORT" INFO rdma | tr -d '\r' | grep -E "^rdma_(errors|cm_events|pending|releasing)" | sed 's/^/# /'
            fail "round $round: $n RDMA clients left 30 s after SIGKILL"; return 1
        fi
        expect_eq "round $round: INFO clients agrees (only this asker)" "$("$CLI912" -h 127.0.0.1 -p "$PORT" INFO clients | tr -d '\r' | sed -n 's/^connected_clients://p')" 1 || return 1
    done
    server_alive
}
run_case "ours clients SIGKILLed while pipelining 4 KiB SETs (io-threads 4) are closed" case_killed_mid_pipeline

case_feature_flood() {  # 2000 unsupported SetClientFeature at loglevel debug: the log lines about them are bounded
    start_server featflood "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ --loglevel debug || return 1
    local out; out=$(timeout 120 "$TEST_PEER" -h "$RDMA_ADDR" -p "$PORT" --hostile feature-flood 2>&1); local rc=$?
    echo "# hostile feature-flood: $(echo "$out" | tr '\n' ' ') (exit $rc)"
    expect_eq "outcome" "$(echo "$out" | tail -n1)" StillOpen || return 1
    local lines; lines=$(grep -c "SetClientFeature" "$SERVER_LOG")
    grep "SetClientFeature" "$SERVER_LOG" | tail -n 2 | sed 's/^/# log: /'
    echo "# log lines about SetClientFeature: $lines (2000 sent)"
    [ "$lines" -le 100 ] || { fail "$lines log lines for one client's 2000 messages"; return 1; }
    expect_serving "after the flood" && server_alive
}
run_case "ours hostile: SetClientFeature flood at loglevel debug (log lines bounded)" case_feature_flood

case_register_wrap() {  # RegisterXferMemory whose region wraps past 2^64: a protocol violation, not a failed write
    start_server regwrap "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    local out; out=$(timeout 60 "$TEST_PEER" -h "$RDMA_ADDR" -p "$PORT" --hostile register-wrap 2>&1)
    echo "# hostile register-wrap: $out"
    expect_eq "outcome" "$out" ClosedByServer || return 1
    local v; v=$(rdma_info protocol_violations); echo "# INFO rdma protocol_violations: $v"
    expect_eq "counted as bad_register_address" "$(dict_get "$v" bad_register_address)" 1 || return 1
    grep "closing the connection" "$SERVER_LOG" | sed 's/^/# log: /'
    grep -q "wraps past the end of the address space" "$SERVER_LOG" || { fail "no log line naming the violation"; return 1; }
    expect_serving "after the violation" && server_alive
}
run_case "ours hostile: RegisterXferMemory wrapping the address space is a violation" case_register_wrap

case_rdma_read_refused() {  # an RDMA READ of the server's RX buffer fails (the protocol never reads)
    start_server rdmaread "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    local out; out=$(timeout 60 "$TEST_PEER" -h "$RDMA_ADDR" -p "$PORT" --hostile rdma-read 2>&1)
    echo "# hostile rdma-read: $out"
    expect_eq "outcome" "$out" ReadRefused || return 1
    expect_serving "after the refused read" && server_alive
}
run_case "ours hostile: an RDMA READ of the server's RX buffer is refused" case_rdma_read_refused

case_window_address_hidden() {  # RegisterXferMemory names no address of the server's memory (no ASLR leak)
    start_server window "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    timeout 60 "$TEST_PEER" -h "$RDMA_ADDR" -p "$PORT" --probe 3 > "$WORK/window.out" 2>&1 &
    local pp=$! i
    for i in $(seq 1 40); do [ "$(rdma_info connected_clients)" = 1 ] && break; sleep 0.1; done
    expect_eq "the probe is connected while the mappings are read" "$(rdma_info connected_clients)" 1 || { kill $pp; return 1; }
    cp "/proc/$SERVER_PID/maps" "$WORK/window.maps"
    wait $pp; echo "# probe: $(cat "$WORK/window.out")"
    local w; w=$(sed -n 's/.* window=\(0x[0-9a-f]*\) .*/\1/p' "$WORK/window.out")
    [ -n "$w" ] && [ $((w)) -ne 0 ] || { fail "no window address in the probe's output"; return 1; }
    local inside
    inside=$(awk -v w="$w" 'BEGIN { w = tolower(substr(w, 3)); w = sprintf("%016s", w); gsub(/ /, "0", w) }
        { split($1, r, "-"); lo = sprintf("%016s", r[1]); hi = sprintf("%016s", r[2]); gsub(/ /, "0", lo); gsub(/ /, "0", hi)
          if (w >= lo && w < hi) print }' "$WORK/window.maps")
    [ -z "$inside" ] || { fail "the window $w is inside the server's mapping: $inside"; return 1; }
    echo "# the window $w lies in none of the server's $(wc -l < "$WORK/window.maps") mappings"
    expect_serving "after the probe" && server_alive
}

run_case "ours the RX window's address reveals nothing of the server's memory layout" case_window_address_hidden

case_stop_receiving() {  # infinite RNR retry and no receives: the server's writes wait, the server gives up on its own clock
    start_server stoprecv "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    local t0=$SECONDS out; out=$(timeout 90 "$TEST_PEER" -h "$RDMA_ADDR" -p "$PORT" --hostile stop-receiving --hold 40 2>&1)
    echo "$out" | sed 's/^/# hostile stop-receiving: /'
    expect_eq "outcome" "$(echo "$out" | tail -n1)" ClosedByServer || return 1
    local e; e=$(rdma_info errors); echo "# INFO rdma errors: $e (after $((SECONDS - t0)) s)"
    expect_eq "closed by the dead-peer rule" "$(dict_get "$e" peer_silent)" 1 || return 1
    expect_serving "after the attack" && server_alive
}
run_case "ours hostile: infinite RNR retry with no receives posted is closed by the server's own deadline" case_stop_receiving

case_grow_in_flight() {  # infinite RNR retry, no receives, 200 larger windows with replies in flight: closed at the bound
    start_server growflight "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    local out; out=$(timeout 120 "$TEST_PEER" -h "$RDMA_ADDR" -p "$PORT" --hostile grow-in-flight 2>&1)
    echo "$out" | sed 's/^/# hostile grow-in-flight: /'
    expect_eq "outcome" "$(echo "$out" | tail -n1)" ClosedByServer || return 1
    local v; v=$(rdma_info protocol_violations); echo "# INFO rdma protocol_violations: $v"
    expect_eq "closed as windows_in_flight, not by the dead-peer rule" "$(dict_get "$v" windows_in_flight)" 1 || return 1
    grep "closing the connection" "$SERVER_LOG" | sed 's/^/# log: /'
    expect_serving "after the attack" && server_alive
}
run_case "ours hostile: infinite RNR retry and 200 larger windows with replies in flight (TX buffers bounded)" case_grow_in_flight

case_half_open_flood() {  # 3,000 connect requests never completed: at most 256 held, TCP and RDMA clients served meanwhile
    start_server halfopen "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ --maxclients 10000 || return 1
    ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
    "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -c 2 -n 100000000 -t ping_mbulk -q > /dev/null 2>&1 &
    local bp=$!
    sleep 2
    timeout 200 "$TEST_PEER" -h "$RDMA_ADDR" -p "$PORT" --hostile half-open-flood --hold 5 > "$WORK/halfopen.out" 2>&1 &
    local hp=$! max=0 n w0 w1 tcp_fail=0
    w0=$(rdma_info total_rdma_writes_in)
    while kill -0 $hp 2>/dev/null; do
        n=$(rdma_info handshakes_in_progress); [ "${n:-0}" -gt "$max" ] && max=$n
        timeout 10 "$CLI912" -h 127.0.0.1 -p "$PORT" PING 2>/dev/null | grep -q PONG || tcp_fail=$((tcp_fail + 1))
        sleep 1
    done
    w1=$(rdma_info total_rdma_writes_in)
    kill $bp 2>/dev/null; wait $bp 2>/dev/null
    sed 's/^/# /' "$WORK/halfopen.out"
    echo "# most connections in the handshake at once: $max; rejected: $(rdma_info rejected_connections); the busy RDMA clients' writes meanwhile: $((w1 - w0))"
    grep "still in the RDMA handshake" "$SERVER_LOG" | head -n 2 | sed 's/^/# log: /'
    [ "$max" -le 256 ] || { fail "$max connections in the handshake at once (at most 256 from one address)"; return 1; }
    [ "$(dict_get "$(rdma_info rejected_connections)" handshakes)" -ge 1 ] || { fail "no connect request rejected for the handshake bound"; return 1; }
    expect_eq "TCP PINGs that failed during the flood" "$tcp_fail" 0 || return 1
    [ $((w1 - w0)) -gt 100 ] || { fail "the busy RDMA clients were starved during the flood"; return 1; }
    local i; for i in $(seq 1 150); do [ "$(rdma_info handshakes_in_progress)" = 0 ] && break; sleep 0.2; done
    expect_eq "connections in the handshake once the flood is gone" "$(rdma_info handshakes_in_progress)" 0 || return 1
    expect_serving "after the flood" && server_alive
}
run_case "ours hostile: 3,000 half-open handshakes (bounded, others served)" case_half_open_flood

case_pinned_ceiling() {  # max-pinned=1mb: what clients make the server pin stays under it; past it, refused with the fix
    start_server ceiling "$VALKEY_912/src/valkey-server" --loadmodule "$OUR_MODULE" max-pinned=1mb --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    grep "pinned-memory ceiling" "$SERVER_LOG" | sed 's/^/# log: /'
    expect_eq "INFO rdma: pinned_ceiling_bytes" "$(rdma_info pinned_ceiling_bytes)" 1048576 || return 1
    local pids=() i max=0 n
    for i in $(seq 1 30); do
        timeout 60 "$RDMA_CLI" -h "$RDMA_ADDR" -p "$PORT" --then-idle 20 PING > "$WORK/ceiling-$i.out" 2>&1 &
        pids+=($!)
    done
    for i in $(seq 1 40); do
        n=$(rdma_info pinned_registered_bytes); [ "${n:-0}" -gt "$max" ] && max=$n
        sleep 0.25
    done
    local served; served=$(grep -l '^PONG' "$WORK"/ceiling-*.out | wc -l)
    echo "# 30 clients at once under a 1 MiB ceiling: $served served, rejected $(rdma_info rejected_connections), most pinned $max bytes"
    grep "pinned-memory ceiling of 1 MiB is reached" "$SERVER_LOG" | head -n 2 | sed 's/^/# log: /'
    kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null
    [ "$max" -le 1048576 ] || { fail "pinned $max bytes, over the 1 MiB ceiling"; return 1; }
    [ "$served" -ge 1 ] || { fail "no client served under the ceiling"; return 1; }
    [ "$served" -lt 30 ] || { fail "all 30 served: the ceiling was not reached"; return 1; }
    grep -q "pinned-memory ceiling of 1 MiB is reached: raise it with the module argument max-pinned=" "$SERVER_LOG" || { fail "no log line naming the ceiling and the fix"; return 1; }
    for i in $(seq 1 100); do [ "$(rdma_info pinned_registered_bytes)" = 0 ] && break; sleep 0.2; done
    expect_eq "pinned once every client left" "$(rdma_info pinned_registered_bytes)" 0 || return 1
    expect_serving "after the clients left" && server_alive
}
run_case "ours pinned-memory ceiling (max-pinned): clients cannot push the server past it" case_pinned_ceiling
