#!/bin/bash
# suite.sh [--impl ours|reference] - the end-to-end suite: real valkey-server binaries,
# real verbs (rxe or a real device), real clients (upstream rdma-test, valkey-cli and
# valkey-benchmark with --rdma). `reference` runs the cases against the upstream C
# module valkey-rdma.so, which proves the test bed; `ours` against target/release/librdma.so.
# E2E_ONLY=PATTERN runs only the cases whose name contains PATTERN.
IMPL=ours
while [ $# -gt 0 ]; do
    case "$1" in
        --impl) IMPL=$2; shift 2 ;;
        *) echo "usage: suite.sh [--impl ours|reference]" >&2; exit 2 ;;
    esac
done
. "$(dirname "$(readlink -f "$0")")/lib.sh"
note "impl=$IMPL RDMA_ADDR=$RDMA_ADDR kernel=$(uname -r) devices: $(ls /sys/class/infiniband | tr '\n' ' ')"

# rdma_server_args TREE: sets SARGS to how this implementation is loaded into the
# server of TREE, listening for RDMA on RDMA_ADDR at the same port as TCP (core configs).
rdma_server_args() {
    local module=$OUR_MODULE
    [ "$IMPL" = reference ] && module=$1/src/valkey-rdma.so
    SARGS=(--loadmodule "$module" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@)
}

# --- cases shared by both implementations ---

case_rdma_test() {  # TREE: upstream tests/rdma/rdma-test --thread 4 against that server
    local tree=$1 out
    rdma_server_args "$tree"
    start_server rdmatest "$tree/src/valkey-server" "${SARGS[@]}" || return 1
    out=$(timeout 300 "$tree/tests/rdma/rdma-test" -h "$RDMA_ADDR" -p "$PORT" --thread 4 2>&1); local rc=$?
    echo "$out" | tail -n 3
    [ $rc = 0 ] && [[ $out == *"Valkey Over RDMA test [OK]"* ]] && server_alive
}

case_cli_ping() {  # TREE: valkey-cli --rdma PING answers PONG, SET/GET round-trips
    local tree=$1 got
    rdma_server_args "$tree"
    start_server cli "$tree/src/valkey-server" "${SARGS[@]}" || return 1
    got=$(timeout 30 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING 2>&1)
    expect_eq "PING over RDMA" "$got" PONG || return 1
    got=$(timeout 30 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" SET k1 hello-rdma 2>&1)
    expect_eq "SET over RDMA" "$got" OK || return 1
    got=$(timeout 30 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" GET k1 2>&1)
    expect_eq "GET over RDMA" "$got" hello-rdma || return 1
    got=$("$CLI912" -h 127.0.0.1 -p "$PORT" GET k1)
    expect_eq "the same key over TCP on the same port" "$got" hello-rdma
}

case_benchmark_rdma_and_tcp() {  # TREE: valkey-benchmark -t set,get over RDMA, and over TCP beside it
    local tree=$1 n=${E2E_BENCH_N:-20000} r
    rdma_server_args "$tree"
    start_server bench "$tree/src/valkey-server" "${SARGS[@]}" || return 1
    timeout 300 "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -t set,get -n "$n" -c 8 -q > "$WORK/bench-rdma.log" 2>&1
    timeout 300 "$BENCH912" -h "$RDMA_ADDR" -p "$PORT" -t set,get -n "$n" -c 8 -q > "$WORK/bench-tcp.log" 2>&1
    local ok=0
    for t in SET GET; do
        local rdma tcp
        rdma=$(bench_rps "$WORK/bench-rdma.log" $t); tcp=$(bench_rps "$WORK/bench-tcp.log" $t)
        printf '# %-4s RDMA %10s req/s   TCP %10s req/s   (-n %s -c 8, %s)\n' "$t" "${rdma:-none}" "${tcp:-none}" "$n" "$(basename "$tree")"
        awk -v r="${rdma:-0}" 'BEGIN { exit !(r > 0) }' || { fail "no RDMA request rate for $t"; ok=1; }
    done
    [ $ok = 0 ] && server_alive
}

case_our_client() {  # TREE: our client library and valkey-rdma-cli against this implementation
    local tree=$1 rcli=$PROJECT_ROOT/target/release/valkey-rdma-cli
    rdma_server_args "$tree"
    start_server ourcli "$tree/src/valkey-server" "${SARGS[@]}" || return 1
    expect_eq "PING" "$(timeout 20 "$rcli" -h "$RDMA_ADDR" -p "$PORT" PING)" PONG || return 1
    expect_eq "SET" "$(timeout 20 "$rcli" -h "$RDMA_ADDR" -p "$PORT" SET ck 'x y')" OK || return 1
    expect_eq "GET" "$(timeout 20 "$rcli" -h "$RDMA_ADDR" -p "$PORT" GET ck)" "x y" || return 1
    expect_eq "GET, formatted as on a terminal" "$(timeout 20 "$rcli" -h "$RDMA_ADDR" -p "$PORT" --no-raw GET ck)" '"x y"' || return 1
    expect_eq "INCR" "$(timeout 20 "$rcli" -h "$RDMA_ADDR" -p "$PORT" --no-raw INCR n)" "(integer) 1" || return 1
    head -c 3000000 /dev/urandom | base64 -w0 > "$WORK/cli-big.txt"
    expect_eq "SET -x of 4 MB" "$(timeout 60 "$rcli" -h "$RDMA_ADDR" -p "$PORT" -x SET big < "$WORK/cli-big.txt")" OK || return 1
    expect_eq "GET of 4 MB" "$(timeout 60 "$rcli" -h "$RDMA_ADDR" -p "$PORT" GET big | md5sum)" "$( (cat "$WORK/cli-big.txt"; echo) | md5sum)" || return 1
    local err; err=$(timeout 20 "$rcli" -h "$RDMA_ADDR" -p $((PORT + 500)) PING 2>&1); echo "# nobody listening: $err"
    case "$err" in *"connection refused"*) ;; *) fail "no 'connection refused' from a port nobody listens on"; return 1 ;; esac
    server_alive
}

for tree in "$VALKEY_912" "$VALKEY_811"; do
    v=$(basename "$tree")
    run_case "$IMPL $v rdma-test --thread 4" case_rdma_test "$tree"
    run_case "$IMPL $v valkey-cli --rdma" case_cli_ping "$tree"
    run_case "$IMPL $v valkey-benchmark --rdma and TCP" case_benchmark_rdma_and_tcp "$tree"
done
run_case "$IMPL valkey-9.1.2 our client library and valkey-rdma-cli" case_our_client "$VALKEY_912"

case_control_messages() {  # TREE: GetServerFeature answered, SetClientFeature 0 accepted, Keepalive every 3 s
    local tree=$1 out
    rdma_server_args "$tree"
    start_server probe "$tree/src/valkey-server" "${SARGS[@]}" || return 1
    out=$(timeout 60 "$PROJECT_ROOT/target/release/valkey-rdma-test-peer" -h "$RDMA_ADDR" -p "$PORT" --probe 7 2>&1); echo "# $out"
    local n; n=$(echo "$out" | sed -n 's/.*keepalives=\([0-9]*\).*/\1/p')
    case "$out" in "features=0 keepalives="*' ping=Status("PONG")') ;; *) fail "unexpected probe result"; return 1 ;; esac
    [ "${n:-0}" -ge 2 ] || { fail "fewer than 2 Keepalives in 7 s"; return 1; }
    server_alive
}
run_case "$IMPL valkey-9.1.2 control messages: features, keepalive" case_control_messages "$VALKEY_912"

. "$(dirname "$(readlink -f "$0")")/shapes.sh"
if [ "$IMPL" = ours ]; then
    . "$(dirname "$(readlink -f "$0")")/ours.sh"
    . "$(dirname "$(readlink -f "$0")")/contract.sh"
    . "$(dirname "$(readlink -f "$0")")/bridge.sh"
fi
summary
