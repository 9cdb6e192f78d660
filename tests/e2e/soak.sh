#!/bin/bash
# soak.sh [MINUTES] [--impl ours|c] - endurance against one 9.1.2 server (io-threads 4)
# for MINUTES minutes of wall clock: rounds of ~45 s, started while time is left, each with
# all at once:
#   - connection churn: valkey-benchmark --rdma -k 0 (a new RDMA connection per request);
#   - pipelined load with multi-block replies: -c 100 -P 32 -t set,get,lrange_600;
#   - CLIENT KILL storms (every 3 s, over TCP, every normal client) under that load;
#   - groups killed at once: 50 connections of valkey-benchmark SIGKILLed after 2 s, twice;
#   - BGSAVE forks (every 10 s);
# then the load stops and the server's fds, RSS, VmPin and RDMA connected clients are
# sampled once every client is gone and the data set is flushed (FLUSHALL: the benchmark's
# LPUSHes grow a list every round). Required: fds and VmPin back to the baseline, no RDMA
# client left, RSS within 16 MiB of the baseline (allocator caches), no crash or assertion
# in the log, and the server still answering over RDMA. Prints one row per minute and
# "soak: N passed, N failed" (one check per minute, one for the whole run).
. "$(dirname "$(readlink -f "$0")")/lib.sh"
MINUTES=${1:-2}
IMPL=ours
[ "${2:-}" = "--impl" ] && IMPL=${3:-ours}
MODULE=$OUR_MODULE
[ "$IMPL" = c ] && MODULE=$VALKEY_912/src/valkey-rdma.so
BGPIDS=()

start_server soak "$VALKEY_912/src/valkey-server" --loadmodule "$MODULE" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ \
    --io-threads 4 --maxclients 2000 || { echo "soak: 0 passed, 1 failed"; exit 1; }
note "soak: $MINUTES minute(s), impl=$IMPL, server pid $SERVER_PID, port $PORT"
B=(-h "$RDMA_ADDR" -p "$PORT")

fds() { ls "/proc/$SERVER_PID/fd" 2>/dev/null | wc -l; }
status_kb() { sed -n "s/^$1:[[:space:]]*\([0-9]*\) kB/\1/p" "/proc/$SERVER_PID/status"; }
rdma_clients() {   # INFO rdma for ours; for the C module, connected clients minus this asker
    if [ "$IMPL" = ours ]; then
        "$CLI912" -h 127.0.0.1 -p "$PORT" INFO rdma | tr -d '\r' | sed -n 's/^rdma_connected_clients://p'
    else
        echo $(( $("$CLI912" -h 127.0.0.1 -p "$PORT" INFO clients | tr -d '\r' | sed -n 's/^connected_clients://p') - 1 ))
    fi
}
settle() {  # waits up to 30 s for every RDMA client to be gone (ours: and released)
    local i
    for i in $(seq 1 60); do [ "$(rdma_clients)" = 0 ] && [ "$(releasing)" = 0 ] && return 0; sleep 0.5; done
    return 1
}
releasing() {  # ours: closed connections the rdma-release thread has yet to free
    if [ "$IMPL" = ours ]; then
        "$CLI912" -h 127.0.0.1 -p "$PORT" INFO rdma | tr -d '\r' | sed -n 's/^rdma_releasing_connections://p'
    else
        echo 0
    fi
}
bg() { "$@" > /dev/null 2>&1 & BGPIDS+=($!); }

one_minute() {
    local end=$((SECONDS + 45)) i
    BGPIDS=()
    bg timeout 45 "$BENCH912" --rdma "${B[@]}" -k 0 -c 4 -n 100000000 -t ping -q
    bg bash -c "end=\$((SECONDS + 45)); while [ \$SECONDS -lt \$end ]; do timeout \$((end - SECONDS)) '$BENCH912' --rdma -h '$RDMA_ADDR' -p '$PORT' -c 100 -P 32 -d 64 -t set,get,lrange_600 -n 100000000 -q; sleep 0.5; done"
    bg bash -c "end=\$((SECONDS + 45)); while [ \$SECONDS -lt \$end ]; do sleep 3; '$CLI912' -h 127.0.0.1 -p '$PORT' CLIENT KILL TYPE normal SKIPME yes; done"
    bg bash -c "end=\$((SECONDS + 45)); while [ \$SECONDS -lt \$end ]; do sleep 10; '$CLI912' -h 127.0.0.1 -p '$PORT' BGSAVE; done"
    for i in 1 2; do
        sleep 5
        "$BENCH912" --rdma "${B[@]}" -c 50 -n 100000000 -t set -q > /dev/null 2>&1 &
        local kp=$!
        sleep 2; kill -9 $kp 2>/dev/null; wait $kp 2>/dev/null
    done
    while [ $SECONDS -lt $end ]; do sleep 1; done
    for i in "${BGPIDS[@]}"; do wait "$i" 2>/dev/null; done
}

BASE_FDS=$(fds) BASE_RSS=$(status_kb VmRSS) BASE_PIN=$(status_kb VmPin)
used_kb() { echo $(( $("$CLI912" -h 127.0.0.1 -p "$PORT" INFO memory | tr -d '\r' | sed -n 's/^used_memory://p') / 1024 )); }
printf '# %-6s %6s %10s %8s %8s %12s %s\n' round fds rss_kb vmpin_kb clients used_mem_kb note
printf '# %-6s %6s %10s %8s %8s %12s %s\n' base "$BASE_FDS" "$BASE_RSS" "$BASE_PIN" 0 "$(used_kb)" ""
P=0 F=0
SOAK_START=$SECONDS m=0
while [ $((SECONDS - SOAK_START)) -lt $((MINUTES * 60)) ]; do
    m=$((m + 1))
    one_minute
    settled=yes; settle || settled=no
    "$CLI912" -h 127.0.0.1 -p "$PORT" FLUSHALL SYNC > /dev/null
    f=$(fds) r=$(status_kb VmRSS) p=$(status_kb VmPin) c=$(rdma_clients) why=""
    kill -0 "$SERVER_PID" 2>/dev/null || why+=" server died"
    [ "$settled" = yes ] || why+=" clients left"
    [ "${f:-0}" -le $((BASE_FDS + 2)) ] || why+=" fds grew"
    [ "${p:-1}" = "$BASE_PIN" ] || why+=" VmPin not back"
    [ "${r:-0}" -le $((BASE_RSS + 16384)) ] || why+=" RSS grew by more than 16 MiB"
    printf '# %-6s %6s %10s %8s %8s %12s %s\n' "$m" "$f" "$r" "$p" "$c" "$(used_kb)" "${why:-flat} ($(( (SECONDS - SOAK_START) / 60 )) min)"
    if [ -z "$why" ]; then P=$((P + 1)); else F=$((F + 1)); fi
    [ -n "$why" ] && [[ $why == *"server died"* ]] && break
done
if grep -aqE "crashed by signal|ASSERTION FAILED|Guru Meditation|panicked" "$SERVER_LOG"; then
    grep -aE "crashed by signal|ASSERTION FAILED|Guru Meditation|panicked" "$SERVER_LOG" | head -n 3; F=$((F + 1))
elif [ "$(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING 2>&1)" = PONG ]; then
    P=$((P + 1))
else
    echo "# the server no longer answers over RDMA"; F=$((F + 1))
fi
if [ "$IMPL" = ours ]; then
    "$CLI912" -h 127.0.0.1 -p "$PORT" INFO rdma | tr -d '\r' | grep -E "total_connections|rejected|errors|violations|disconnects|budget" | sed 's/^/# /'
    # the dead-peer rule (docs/protocol.md §5) must never take a live client for dead, however busy
    silent=$("$CLI912" -h 127.0.0.1 -p "$PORT" INFO rdma | tr -d '\r' | sed -n 's/^rdma_errors:.*peer_silent=\([0-9]*\).*/\1/p')
    if [ "${silent:-x}" = 0 ]; then P=$((P + 1)); else echo "# live clients closed as silent peers: ${silent:-?}"; F=$((F + 1)); fi
fi
grep -c "closing the connection" "$SERVER_LOG" | sed 's/^/# per-connection warning lines in the log: /'
stop_all_servers
echo "soak: $P passed, $F failed"
[ "$F" = 0 ]
