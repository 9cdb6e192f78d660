#!/bin/bash
# bench.sh OUTDIR - our module against the upstream C module on the same server binary
# and the same client, alternating ABBA over several rounds, plus TCP; ratios ours/C with
# the spread of the per-round ratios beside them (the noise), and once the C module
# against itself (A/A: what a ratio of 1 looks like in this bed).
# Under Soft-RoCE in a TCG guest the absolute numbers measure the emulator; the ratios
# between the two modules (same server, same client, same run) are what to read.
# BENCH_C_MODULE=PATH puts another module in the C module's place (an older build of ours,
# to compare two builds directly); OUR_MODULE=PATH another in ours'.
. "$(dirname "$(readlink -f "$0")")/lib.sh"
OUT=${1:-$PWD}
B=$PROJECT_ROOT/target/release/valkey-rdma-bench
C_MODULE=${BENCH_C_MODULE:-$VALKEY_912/src/valkey-rdma.so}
ROUNDS=${BENCH_ROUNDS:-5}
# Every row warms each connection up with one pipeline before the clock starts: the C
# module registers its buffers when a client connects, ours when the client first uses
# them, and the row's "first use" line (connect + first pipeline) shows both costs.
run() {  # NAME ARGS...: valkey-rdma-bench --compare
    local name=$1; shift
    echo "== $name: --warmup 1 $*"
    "$B" --compare --server "$VALKEY_912/src/valkey-server" --c-module "$C_MODULE" \
        --our-module "${COMPARE_WITH:-$OUR_MODULE}" -h "$RDMA_ADDR" -p "$NEXT_PORT" -q --warmup 1 "$@" \
        --json "$OUT/$name.json" --svg "$OUT/$name.svg" | tee "$OUT/$name.txt"
    NEXT_PORT=$((NEXT_PORT + 50))
}

# ratio_line NAME UNIT C_VALUES OURS_VALUES: medians, ratio and per-round ratio spread.
ratio_line() {
    python3 - "$@" <<'EOF'
import sys, statistics
name, unit, c, o = sys.argv[1], sys.argv[2], [float(x) for x in sys.argv[3].split()], [float(x) for x in sys.argv[4].split()]
per = [b / a for a, b in zip(c, o) if a > 0]
mc, mo = statistics.median(c), statistics.median(o)
print(f"{name}: C module {mc:.1f} {unit}, ours {mo:.1f} {unit}, ours/C {mo / mc if mc else 0:.3f} "
      f"(rounds {min(per):.3f}-{max(per):.3f}, {len(per)} rounds)" if per else f"{name}: no data")
EOF
}

module_of() { if [ "$1" = c ]; then echo "$C_MODULE"; else echo "$OUR_MODULE"; fi; }
abba() { if [ $(($1 % 2)) = 1 ]; then echo "c ours"; else echo "ours c"; fi; }

# vb_compare NAME TEST ARGS...: valkey-benchmark --rdma ARGS on a fresh server per module
# and round (ABBA); req/s of TEST.
vb_compare() {
    local name=$1 test=$2; shift 2
    local r m rate c=() o=()
    echo "== $name: valkey-benchmark --rdma $*"
    for r in $(seq 1 "$ROUNDS"); do
        for m in $(abba "$r"); do
            start_server "vb-$name-$r-$m" "$VALKEY_912/src/valkey-server" --loadmodule "$(module_of $m)" \
                --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ > /dev/null || return 1
            timeout 600 "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" "$@" -q > "$OUT/$name-$r-$m.log" 2>&1
            rate=$(bench_rps "$OUT/$name-$r-$m.log" "$test")
            echo "round $r $m: ${rate:-none} req/s"
            if [ $m = c ]; then c+=("${rate:-0}"); else o+=("${rate:-0}"); fi
            stop_all_servers
        done
    done
    ratio_line "$name req/s" "req/s" "${c[*]}" "${o[*]}" | tee "$OUT/$name.txt"
}

# idle_compare N: N idle RDMA connections (valkey-benchmark -I) on a fresh server per
# module and round; server VmPin and RSS added per connection.
idle_compare() {
    local n=$1 r m pin rss cp=() op=() cr=() or=()
    echo "== idle-$n: $n idle connections (valkey-benchmark --rdma -I -c $n)"
    for r in $(seq 1 3); do
        for m in $(abba "$r"); do
            start_server "idle-$r-$m" "$VALKEY_912/src/valkey-server" --loadmodule "$(module_of $m)" \
                --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ --maxclients 10000 > /dev/null || return 1
            local pin0 rss0 i
            pin0=$(awk '/^VmPin:/ {print $2}' "/proc/$SERVER_PID/status") rss0=$(awk '/^VmRSS:/ {print $2}' "/proc/$SERVER_PID/status")
            "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -I -c "$n" > /dev/null 2>&1 &
            local bp=$!
            for i in $(seq 1 300); do
                [ "$("$CLI912" -p "$PORT" INFO clients | tr -d '\r' | sed -n 's/^connected_clients://p')" -gt "$n" ] && break
                sleep 0.2
            done
            sleep 7   # past two keepalive ticks
            pin=$(( ($(awk '/^VmPin:/ {print $2}' "/proc/$SERVER_PID/status") - pin0) / n ))
            rss=$(( ($(awk '/^VmRSS:/ {print $2}' "/proc/$SERVER_PID/status") - rss0) / n ))
            echo "round $r $m: VmPin $pin KiB, RSS $rss KiB per idle connection"
            kill $bp; wait $bp 2>/dev/null
            if [ $m = c ]; then cp+=("$pin") cr+=("$rss"); else op+=("$pin") or+=("$rss"); fi
            stop_all_servers
        done
    done
    { ratio_line "idle-$n VmPin per connection" KiB "${cp[*]}" "${op[*]}"
      ratio_line "idle-$n RSS per connection" KiB "${cr[*]}" "${or[*]}"; } | tee "$OUT/idle-$n.txt"
}

# BENCH_ONLY=NAME,NAME: only those workloads (their names below; "capacity": the 10,000
# idle connections at the end)
only() { [ -z "${BENCH_ONLY:-}" ] || [[ ",$BENCH_ONLY," == *",$1,"* ]]; }
only set-get-c8-p1 && run set-get-c8-p1 --rounds "$ROUNDS" -c 8 -P 1 -t set,get -d 64 -n 20000
only set-get-c8-p16 && run set-get-c8-p16 --rounds "$ROUNDS" -c 8 -P 16 -t set,get -d 64 -n 100000
only set-get-c32-p1 && run set-get-c32-p1 --rounds "$ROUNDS" -c 32 -P 1 -t set,get -d 64 -n 40000
only set-get-c32-p16 && run set-get-c32-p16 --rounds "$ROUNDS" -c 32 -P 16 -t set,get -d 64 -n 200000
only set-get-c4-4k && run set-get-c4-4k --rounds "$ROUNDS" -c 4 -P 1 -t set,get -d 4096 -n 10000
# Large values on two keys per row, so that every GET after the first SETs returns the
# whole value (with the default 10,000 keys almost every GET missed, and the rows
# measured large SETs only).
only set-get-c2-1m && run set-get-c2-1m --rounds "$ROUNDS" -c 2 -P 1 -t set,get -d 1048576 -r 2 -n 200
only set-get-c1-8m && run set-get-c1-8m --rounds "$ROUNDS" -c 1 -P 1 -t set,get -d 8388608 -r 2 -n 40
# replies of many blocks (about 1.1 MB and 1.2 MB each: the multi-block reply path)
only big-replies-c4 && run big-replies-c4 --rounds "$ROUNDS" -c 4 -P 1 -t lrange_10000,hgetall -d 100 -n 200
# A/A: the C module against itself, the bed's noise for a ratio of 1
only aa-noise-c-vs-c && COMPARE_WITH=$C_MODULE run aa-noise-c-vs-c --rounds "$ROUNDS" -c 8 -P 1 -t set,get -d 64 -n 20000
# connection churn: a new RDMA connection per request. 900: valkey-benchmark itself fails
# after about 990 reconnects ("RDMA: alloc comp channel failed": it does not free the
# channels of the connections it closed), before it prints its rate.
only churn-k0 && vb_compare churn-k0 PING_INLINE -k 0 -c 4 -n 900 -t ping_inline
only idle-200 && idle_compare 200
# instructions per request, counted exactly (callgrind), split by object: tests/e2e/instructions.sh
only instructions && "$(dirname "$(readlink -f "$0")")/instructions.sh" "$OUT"
# finish: the run's table (ratios ours/C, per-round spread) into summary.md, as the README shows it
finish() {
    python3 "$(dirname "$(readlink -f "$0")")/bench_table.py" "$OUT" > "$OUT/summary.md" && cat "$OUT/summary.md"
    [ ! -f "$OUT/instructions.md" ] || { echo; cat "$OUT/instructions.md"; } | tee -a "$OUT/summary.md"
    echo "results in $OUT"
}
only capacity || { finish; exit 0; }
# capacity: 10,000 idle connections held by one client process on one server, each PINGed
# twice (tests/e2e/idle-capacity.sh). Then vm.max_map_count is raised: each connection takes
# about 8 memory mappings in the server, and the default 65530 admits about 5,800 (the
# rest are refused with a log line naming the limit). The C module at the same N: its
# server is OOM-killed in an 8 GiB guest long before (about 1,600 on 2026-11-30).
. "$(dirname "$(readlink -f "$0")")/idle-capacity.sh"
if [ -z "${BENCH_IDLE_N:-}" ]; then   # 10,000 needs about 4.8 GB (server 384 KiB, client 94 KiB each)
    avail=$(awk '/^MemAvailable/ {print $2}' /proc/meminfo)
    BENCH_IDLE_N=$(( avail * 65 / 100 / 480 / 100 * 100 )); [ "$BENCH_IDLE_N" -gt 10000 ] && BENCH_IDLE_N=10000
    [ "$BENCH_IDLE_N" -lt 10000 ] && echo "note: $avail KiB available: $BENCH_IDLE_N idle connections (10,000 need an 8 GiB guest: run-in-vm.sh -m 8G)"
fi
# first at the default vm.max_map_count (two client processes, so that the server's limit
# comes first): where ours stops and what it logs
IDLE_TAG=default-maps IDLE_PROCS=2 IDLE_TIMEOUT=300 idle_capacity "${BENCH_IDLE_N:-10000}" ours "$OUT" \
    | tee "$OUT/idle-capacity-ours-default-maps.txt"
IDLE_MAX_MAP_COUNT=${IDLE_MAX_MAP_COUNT:-262144} idle_capacity "${BENCH_IDLE_N:-10000}" ours "$OUT" \
    | tee "$OUT/idle-capacity-ours.txt"
IDLE_MAX_MAP_COUNT=${IDLE_MAX_MAP_COUNT:-262144} IDLE_TIMEOUT=300 idle_capacity "${BENCH_IDLE_N:-10000}" c "$OUT" \
    | tee "$OUT/idle-capacity-c.txt"
finish
