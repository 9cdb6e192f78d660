# lib.sh - helpers for the end-to-end suite. Sourced by suite.sh; runs where RDMA is
# (inside the Soft-RoCE guest, or on a host with an RDMA device). Needs RDMA_ADDR.
set -uo pipefail
: "${RDMA_ADDR:?RDMA_ADDR must name an address on an RDMA device}"
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../../testbed/env.sh"
WORK=${E2E_WORK:-$PWD}          # logs and server dirs; writable
PASSED=0 FAILED=0 SKIPPED=0 FAILED_NAMES=()
CLI912="$VALKEY_912/src/valkey-cli"
BENCH912="$VALKEY_912/src/valkey-benchmark"
OUR_MODULE=${OUR_MODULE:-$PROJECT_ROOT/target/release/librdma.so}
NEXT_PORT=${E2E_BASE_PORT:-6400}

BRIDGE=${BRIDGE:-$PROJECT_ROOT/target/release/valkey-rdma-bridge}
BRIDGE_PID="" BRIDGE_LOG="" BPORT=""

note() { echo "# $*"; }

# start_bridge TO_PORT [bridge args...]: valkey-rdma-bridge on 127.0.0.1:$((TO_PORT+2000))
# relaying to RDMA_ADDR:TO_PORT; waits for its "listening on" line (up to 60 s: the
# TCG guest is slow under load). Its stderr goes to BRIDGE_LOG_FILE (default
# $WORK/bridge-BPORT.log). Sets BPORT, BRIDGE_PID, BRIDGE_LOG.
start_bridge() {
    local to=$1; shift
    BPORT=$((to + 2000))
    BRIDGE_LOG=${BRIDGE_LOG_FILE:-$WORK/bridge-$BPORT.log}
    local out="$BRIDGE_LOG.out"
    "$BRIDGE" --listen "127.0.0.1:$BPORT" --to "$RDMA_ADDR:$to" "$@" > "$out" 2> "$BRIDGE_LOG" < /dev/null &
    BRIDGE_PID=$!
    local i
    for i in $(seq 1 600); do
        if grep -q "^valkey-rdma-bridge: listening on 127.0.0.1:$BPORT, relaying to $RDMA_ADDR:$to over RDMA$" "$out"; then
            return 0
        fi
        kill -0 "$BRIDGE_PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "the bridge did not come up; stdout/stderr:"; cat "$out" "$BRIDGE_LOG"
    return 1
}

# stop_bridge: SIGTERM, then SIGKILL after 5 s.
stop_bridge() {
    [ -n "$BRIDGE_PID" ] || return 0
    kill "$BRIDGE_PID" 2>/dev/null
    local i
    for i in $(seq 1 50); do kill -0 "$BRIDGE_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$BRIDGE_PID" 2>/dev/null; wait "$BRIDGE_PID" 2>/dev/null
    BRIDGE_PID=""
}

# run_case NAME FUNCTION [ARGS...]: one test; the function's exit status decides.
run_case() {
    local name=$1; shift
    if [ -n "${E2E_ONLY:-}" ]; then   # patterns separated by |
        local pat pats hit=0
        IFS='|' read -ra pats <<< "$E2E_ONLY"
        for pat in "${pats[@]}"; do [[ "$name" == *$pat* ]] && hit=1; done
        [ $hit = 1 ] || return 0
    fi
    local t0=$SECONDS
    echo "--- $name"
    if "$@"; then
        PASSED=$((PASSED + 1)); echo "ok - $name ($((SECONDS - t0)) s)"
    else
        FAILED=$((FAILED + 1)); FAILED_NAMES+=("$name")
        show_server_log_tail
        echo "not ok - $name ($((SECONDS - t0)) s)"
    fi
    [ -n "${KEEP_SERVERS:-}" ] || stop_all_servers   # a cluster outlives its cases
}

fail() { echo "FAIL: $*"; return 1; }

# show_server_log_tail: the last lines of the module's own (`<rdma>`) log of the case's
# last server, so that a failed case says what the server saw, whatever it checked.
show_server_log_tail() {
    [ -n "${SERVER_LOG:-}" ] && [ -f "$SERVER_LOG" ] || return 0
    echo "# the last <rdma> lines of $SERVER_LOG:"
    grep -F '<rdma>' "$SERVER_LOG" | tail -n 20 | cut -c1-300 | sed 's/^/#   /'
}

# expect_eq WHAT GOT WANT
expect_eq() { [ "$2" = "$3" ] || fail "$1: got '$2', want '$3'"; }

SERVER_PIDS=()
# start_server NAME SERVER_BINARY [server args...]: starts a server with TCP on
# RDMA_ADDR and 127.0.0.1 at a fresh port (written @PORT@ in the args); sets PORT,
# SERVER_PID, SERVER_LOG.
start_server() {
    local name=$1 bin=$2; shift 2
    PORT=$NEXT_PORT; NEXT_PORT=$((NEXT_PORT + 1))
    local dir="$WORK/srv-$name-$PORT" args=() a
    mkdir -p "$dir"
    for a in "$@"; do args+=("${a//@PORT@/$PORT}"); done   # @PORT@: the port chosen here
    SERVER_LOG="$dir/server.log"
    "$bin" --port "$PORT" --bind "$RDMA_ADDR" 127.0.0.1 --protected-mode no --save "" --appendonly no \
        --dir "$dir" --logfile "$SERVER_LOG" "${args[@]}" < /dev/null &
    SERVER_PID=$!
    SERVER_PIDS+=("$SERVER_PID")
    local i
    for i in $(seq 1 150); do
        if "$CLI912" -h 127.0.0.1 -p "$PORT" ping 2>/dev/null | grep -q PONG; then return 0; fi
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.2
    done
    echo "server $name did not come up; log:"; tail -n 30 "$SERVER_LOG"
    return 1
}

# server_info PORT SECTION FIELD: one field of the server's INFO, asked over TCP (the
# asker counts as one of its connected clients).
server_info() { "$CLI912" -h 127.0.0.1 -p "$1" INFO "$2" 2>/dev/null | tr -d '\r' | sed -n "s/^$3://p"; }

# server_alive: the last server still runs, has written no crash report, and answers a PING
# over TCP within 120 s. A server that crashed can hang in its crash report for many minutes
# (still a process, answering nothing: seen with the C module), so its log is checked first;
# a live one can be busy for a while (10,000 connections torn down at once under TCG took
# more than 10 s). Sets ALIVE_AFTER: the seconds it took to answer.
server_alive() {
    local t0=$SECONDS
    while kill -0 "$SERVER_PID" 2>/dev/null; do
        grep -qE 'crashed by signal|ASSERTION FAILED|Guru Meditation' "$SERVER_LOG" 2>/dev/null && return 1
        if timeout 10 "$CLI912" -h 127.0.0.1 -p "$PORT" ping 2>/dev/null | grep -q PONG; then
            ALIVE_AFTER=$((SECONDS - t0)); return 0
        fi
        [ $((SECONDS - t0)) -lt 120 ] || return 1
    done
    return 1
}

stop_all_servers() {
    local p
    for p in "${SERVER_PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${SERVER_PIDS[@]}"; do
        for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    SERVER_PIDS=()
}

# bench_rps LOG TEST: the "requests per second" figure valkey-benchmark printed for TEST.
bench_rps() {
    tr '\r' '\n' < "$1" | grep -i "^$2: " | grep "requests per second" | tail -n1 \
        | sed -E 's/^[^:]*: ([0-9.]+) requests per second.*/\1/'
}

summary() {
    echo
    [ ${#FAILED_NAMES[@]} -gt 0 ] && echo "# failed: ${FAILED_NAMES[*]}"
    echo "e2e: $PASSED passed, $FAILED failed"
    [ "$FAILED" = 0 ]
}
