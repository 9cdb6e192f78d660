#!/bin/bash
# idle-capacity.sh N [ours|c] [OUTDIR]: one 9.1.2 server with the module, N idle RDMA
# connections held by one client process (valkey-rdma-bench --idle N), each PINGed when
# opened and again after the hold. Records what the server pays for them (connected
# clients, RSS, VmPin, fds, memory mappings, per connection) and, when fewer than N
# came up, which limit stopped them (the client's failure reasons, the server's log).
# Runs where RDMA is (the guest); sourced by bench.sh or run alone:
#   ./runtest-rdma --vm -- 'tests/e2e/idle-capacity.sh 10000'
# Knobs: IDLE_MAXCLIENTS (default N+100), IDLE_MAX_MAP_COUNT (sysctl vm.max_map_count,
# default: left as it is), IDLE_TAG (added to the name: logs of runs apart), IDLE_CLIENT_ARGS (more valkey-rdma-bench options, e.g.
# "--rx-size 1048576"), IDLE_TIMEOUT (seconds for the client to get them all up, 1200),
# IDLE_PROCS (client processes sharing the N, default 1: a process's own limits, such
# as vm.max_map_count, then come later than the server's), IDLE_ULIMIT_N (the shell's
# file limit, default 65536; "keep": as the guest has it, which valkey-server raises).
declare -F start_server > /dev/null || . "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"

proc_kib() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status" 2>/dev/null; }
fd_count() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null; }
map_count() { wc -l < "/proc/$1/maps" 2>/dev/null; }
# (10 s: a server that crashed can hang in its crash report, answering nothing; seen with the
# C module at about 1,600 connections)
info_field() { timeout 10 "$CLI912" -h 127.0.0.1 -p "$PORT" INFO "$1" 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"; }
per_conn() { if [ "${3:-0}" -gt 0 ]; then echo $(( ($1 - $2) / $3 )); else echo "-"; fi; }

# close_probe UNTIL TIMELINE: from the stop (the clients PING every connection once more,
# then close them all), asks the server over TCP for its client count every 0.1 s until the
# file UNTIL exists, one line per answer in TIMELINE (ms since the stop, ms waited, clients);
# prints the longest wait for an answer (how long the event loop kept others waiting) and
# when the server had let every RDMA client go.
close_probe() {
    local until=$1 timeline=$2 worst=0 worst_at=0 n=0 t0 t dt cc gone_after=-
    t0=$(date +%s%N)
    while [ ! -e "$until" ]; do
        t=$(date +%s%N)
        cc=$(timeout 300 "$CLI912" -h 127.0.0.1 -p "$PORT" INFO clients 2>/dev/null | tr -d '\r' | sed -n 's/^connected_clients://p')
        dt=$(( ($(date +%s%N) - t) / 1000000 )) n=$((n + 1))
        echo "$(( (t - t0) / 1000000 )) $dt ${cc:-?}" >> "$timeline"
        [ "$dt" -gt "$worst" ] && worst=$dt worst_at=$(( (t - t0) / 1000000000 ))
        [ "$gone_after" = - ] && [ "${cc:-9}" -le 1 ] && gone_after=$(( ($(date +%s%N) - t0) / 1000000000 ))
        sleep 0.1
    done
    echo "after the stop: longest wait for the server's answer $worst ms (asked at $worst_at s; $n asked), every client let go after $gone_after s"
}

# idle_capacity N MODULE OUTDIR: the case; prints "idle-capacity ..." lines, status 0
# when all N answered both PINGs and the server survived.
idle_capacity() {
    local n=$1 m=${2:-ours} out=${3:-$WORK}
    local name="idle-$n-$m${IDLE_TAG:+-$IDLE_TAG}" maxclients=${IDLE_MAXCLIENTS:-$((n + 100))}
    local B=$PROJECT_ROOT/target/release/valkey-rdma-bench
    local log="$out/$name.client.log" stop="$out/$name.stop"
    mkdir -p "$out"; rm -f "$stop"
    [ -n "${IDLE_MAX_MAP_COUNT:-}" ] && sysctl -qw vm.max_map_count="$IDLE_MAX_MAP_COUNT"
    # (keep: the limit the guest starts with, which valkey-server raises to maxclients + 32)
    [ "${IDLE_ULIMIT_N:-65536}" = keep ] || ulimit -n "${IDLE_ULIMIT_N:-65536}" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
    echo "== $name: $n idle connections, module $m, maxclients $maxclients"
    echo "limits: ulimit -n $(ulimit -n), ulimit -l $(ulimit -l), vm.max_map_count $(cat /proc/sys/vm/max_map_count)," \
        "memory $(awk '/^MemTotal/ {print $2}' /proc/meminfo) KiB, free $(awk '/^MemAvailable/ {print $2}' /proc/meminfo) KiB"
    start_server "$name" "$VALKEY_912/src/valkey-server" --loadmodule "$(module_of "$m")" \
        --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ --maxclients "$maxclients" > /dev/null || return 1
    local spid=$SERVER_PID rss0 pin0 fd0 map0
    rss0=$(proc_kib "$spid" VmRSS) pin0=$(proc_kib "$spid" VmPin) fd0=$(fd_count "$spid") map0=$(map_count "$spid")
    echo "server $spid before: RSS $rss0 KiB, VmPin $pin0 KiB, fds $fd0, maps $map0," \
        "fd limit $(awk '/Max open files/ {print $4}' "/proc/$spid/limits"), maxclients $("$CLI912" -p "$PORT" CONFIG GET maxclients | tail -n1)"
    local t0=$SECONDS procs=${IDLE_PROCS:-1} k cpids=() logs=() i
    for k in $(seq 1 "$procs"); do
        local share=$(( n / procs + (k <= n % procs ? 1 : 0) )) l="$log.$k"
        # shellcheck disable=SC2086
        "$B" --idle "$share" -h "$RDMA_ADDR" -p "$PORT" --hold 7 --stop-file "$stop" ${IDLE_CLIENT_ARGS:-} > "$l" 2> "$l.err" &
        cpids+=($!) logs+=("$l")
    done
    for i in $(seq 1 "${IDLE_TIMEOUT:-1200}"); do
        local up=0 gone=0
        for k in $(seq 0 $((procs - 1))); do
            grep -q '^idle: holding' "${logs[$k]}" && up=$((up + 1))
            kill -0 "${cpids[$k]}" 2>/dev/null || gone=$((gone + 1))
        done
        [ $((up + gone)) -ge "$procs" ] && break
        kill -0 "$spid" 2>/dev/null || break
        sleep 1
    done
    echo "clients up after $((SECONDS - t0)) s:"; grep -h '^idle:' "${logs[@]}"
    local cpu0 cpu1 ka0 ka1; cpu0=$(cpu_ticks "$spid") ka0=$(info_field rdma rdma_keepalives_sent)
    sleep 7   # past two keepalive ticks: TX buffers of idle connections released
    cpu1=$(cpu_ticks "$spid") ka1=$(info_field rdma rdma_keepalives_sent)
    echo "server CPU while holding: $(( (${cpu1:-0} - ${cpu0:-0}) * 100 / $(getconf CLK_TCK) / 7 )) % of a core (7 s)"
    # (the C module has no INFO rdma)
    [ -n "$ka0" ] && [ -n "$ka1" ] && echo "keepalives while holding: $((ka1 - ka0)) in 7 s"
    local held=0 h cc rej rss pin fds maps crss=0 cpin=0 cfds=0 cmaps=0 c
    local peak=0 p
    for l in "${logs[@]}"; do
        h=$(sed -n 's/^idle: holding \([0-9]*\) connections/\1/p' "$l"); held=$((held + ${h:-0}))
        # the most held at a progress line: how far it got, also when it was killed or lost them later
        p=$(tr '\r' '\n' < "$l.err" | sed -n 's/^idle: \([0-9]*\) held.*/\1/p' | sort -n | tail -n 1); peak=$((peak + ${p:-0}))
    done
    [ "$held" -gt "$peak" ] && peak=$held
    cc=$(info_field clients connected_clients) rej=$(info_field stats rejected_connections)
    rss=$(proc_kib "$spid" VmRSS) pin=$(proc_kib "$spid" VmPin) fds=$(fd_count "$spid") maps=$(map_count "$spid")
    for c in "${cpids[@]}"; do
        crss=$((crss + $(proc_kib "$c" VmRSS || echo 0))) cpin=$((cpin + $(proc_kib "$c" VmPin || echo 0)))
        cfds=$((cfds + $(fd_count "$c"))) cmaps=$((cmaps + $(map_count "$c" || echo 0)))
    done
    echo "server while held: connected_clients ${cc:-?}, rejected_connections ${rej:-?}, RSS $rss KiB, VmPin $pin KiB, fds $fds, maps $maps"
    echo "client$( [ "$procs" -gt 1 ] && echo "s ($procs processes)") while held: RSS $crss KiB, VmPin $cpin KiB, fds $cfds, maps $cmaps"
    echo "guest: MemAvailable $(awk '/^MemAvailable/ {print $2}' /proc/meminfo) KiB, Slab $(awk '/^Slab/ {print $2}' /proc/meminfo) KiB, VmallocUsed $(awk '/^VmallocUsed/ {print $2}' /proc/meminfo) KiB"
    echo "idle-capacity $name: held ${held:-0} of $n (at most $peak up at once); per connection: server RSS $(per_conn "${rss:-0}" "$rss0" "${held:-0}") KiB," \
        "VmPin $(per_conn "${pin:-0}" "$pin0" "${held:-0}") KiB, fds $(per_conn "${fds:-0}" "$fd0" "${held:-0}")," \
        "maps $(per_conn "${maps:-0}" "$map0" "${held:-0}"); client RSS $(per_conn "${crss:-0}" 0 "${held:-0}") KiB"
    local probe_stop="$out/$name.probe-stop" probe comp0 wake0
    comp0=$(info_field rdma rdma_completions) wake0=$(info_field rdma rdma_completion_wakeups)
    rm -f "$probe_stop"
    touch "$stop"
    rm -f "$out/$name.timeline"
    close_probe "$probe_stop" "$out/$name.timeline" > "$out/$name.probe" & probe=$!
    local rc=0
    for c in "${cpids[@]}"; do
        for i in $(seq 1 600); do kill -0 "$c" 2>/dev/null || break; sleep 1; done
        kill "$c" 2>/dev/null; wait "$c" || rc=$?
    done
    for l in "${logs[@]}"; do
        grep '^idle:' "$l" | sed -n '/holding/,$p' | tail -n +2
        grep -v '^idle: [0-9]* held' "$l.err" | tail -n 5
    done
    echo "server log, RDMA lines (of $(grep -c 'RDMA' "$SERVER_LOG") lines, $(grep -c 'refused' "$SERVER_LOG") refusals):"
    grep -E 'RDMA|maxclients|max number|file descriptors|open files' "$SERVER_LOG" | grep -v 'listening on' | head -n 12
    grep -E 'crashed by signal|Accessing address|ASSERTION' "$SERVER_LOG" | head -n 3
    if server_alive; then echo "server alive after the run (answered a PING after $ALIVE_AFTER s)"; else echo "SERVER DIED"; rc=1; fi
    # (until every client is let go, at most 120 s more)
    for i in $(seq 1 120); do cc=$(info_field clients connected_clients); [ "${cc:-9}" -le 1 ] && break; sleep 1; done
    touch "$probe_stop"; wait "$probe"; cat "$out/$name.probe"
    # ours: the completions the event loop polled from the stop on (the second PINGs: 2 or 3
    # a connection; a QP flushed at its teardown: 256 more)
    [ -n "$comp0" ] && echo "INFO rdma from the stop on: completions +$(( $(info_field rdma rdma_completions) - comp0 )), wake-ups +$(( $(info_field rdma rdma_completion_wakeups) - wake0 ))"
    dmesg 2>/dev/null | grep -iE 'oom|killed process|rxe' | tail -n 5
    stop_all_servers
    return $rc
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    module_of() { if [ "$1" = c ]; then echo "$VALKEY_912/src/valkey-rdma.so"; else echo "$OUR_MODULE"; fi; }
    IDLE_TAG=${IDLE_TAG:-$$} idle_capacity "${1:-10000}" "${2:-ours}" "${3:-$WORK}"
fi
