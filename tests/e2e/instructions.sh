#!/bin/bash
# instructions.sh OUTDIR - what a request costs the server in user-space instructions,
# counted exactly rather than sampled: valkey-server 9.1.2 runs under valgrind's
# callgrind, once with our module and once with the upstream C module; for each workload
# valkey-benchmark --rdma runs against it, the counters are zeroed once its connections
# are up and warm, and dumped after a window. Each dump is split by object
# (callgrind_split.py): the module, rdma-core (libibverbs, librdmacm, the provider),
# libc, valkey-server itself, the rest; divided by the commands the server ran in the
# window (its calls of processCommand, counted by callgrind too). The kernel's part
# (system calls, the rxe transport) is not counted: on a NIC most of it goes away, but
# not the completion events (an interrupt and a read of the channel's fd each), which
# the table counts per request (calls of ibv_get_cq_event). Nor is
# the work of timers (per second, not per request; see measure_impl). libc's block
# copies get a column of their own: callgrind counts a `rep movsb` per byte, so a copy
# cut into pieces of other sizes reads as thousands of instructions more or less per
# request (callgrind_split.py); "whole process less copies" compares the rest.
# Under TCG the timings are noise; these counts repeat to within a fraction of a percent.
. "$(dirname "$(readlink -f "$0")")/lib.sh"
OUT=${1:-$PWD}
WARM=${INSTR_WARM:-6} WINDOW=${INSTR_WINDOW:-15}
SPLIT=$(dirname "$(readlink -f "$0")")/callgrind_split.py
# BENCH_C_MODULE=PATH: another module in the C module's place, as in bench.sh (an older
# build of ours, to count two builds in one run; its file name must match librdma*.so)
C_MODULE=${BENCH_C_MODULE:-$VALKEY_912/src/valkey-rdma.so}
mkdir -p "$OUT/callgrind"
VG_PREFIX=/dev/shm/valkey-rdma-vgdb   # vgdb maps shared memory: tmpfs (the guest has no writable /tmp)

# WORKLOADS: name and valkey-benchmark arguments; GETs read keys a SET filled first: 64 B
# at 1 connection (a wake-up per request for both modules), 4 and 32 connections, with and
# without a pipeline; 4 KiB; and a reply of several blocks (64 KiB: the server's reply
# list, written with writev)
WORKLOADS=(
    "get-64B-c1-P1|-c 1 -P 1 -d 64 -t get"
    "set-64B-c1-P1|-c 1 -P 1 -d 64 -t set"
    "get-64B-c4-P1|-c 4 -P 1 -d 64 -t get"
    "set-64B-c4-P1|-c 4 -P 1 -d 64 -t set"
    "get-64B-c4-P16|-c 4 -P 16 -d 64 -t get"
    "get-4KiB-c2-P1|-c 2 -P 1 -d 4096 -t get"
    "set-4KiB-c2-P1|-c 2 -P 1 -d 4096 -t set"
    "set-64B-c32-P1|-c 32 -P 1 -d 64 -t set"
    "get-64B-c32-P16|-c 32 -P 16 -d 64 -t get"
    "get-64KiB-c2-P1|-c 2 -P 1 -d 65536 -t get"
)

clients_of() {  # PORT: the server's RDMA clients (its connected clients but this one, over TCP)
    local n; n=$(server_info "$1" clients connected_clients)
    echo $(( ${n:-1} - 1 ))
}

measure_impl() {  # IMPL MODULE: one server under callgrind, every workload against it
    local impl=$1 module=$2 port=$NEXT_PORT dir="$OUT/callgrind/$1" w name args
    NEXT_PORT=$((NEXT_PORT + 1)); mkdir -p "$dir"
    # Timers run per second, not per request: the server's time events (serverCron, the C
    # module's keepalive timers) and our module's timer (a timerfd the event loop
    # watches: its Keepalives and its once-a-period checks) are left out, so that a slow
    # host, which serves fewer requests per second under callgrind, does not spread them
    # over fewer requests. (--toggle-collect turns counting off inside those functions;
    # it also sets --collect-atstart=no, so that comes after it.)
    # shellcheck disable=SC2086
    valgrind --tool=callgrind --toggle-collect=processTimeEvents '--toggle-collect=rdma::server::conntype::tick*' \
        --collect-atstart=yes ${INSTR_VG_ARGS:-} --vgdb-prefix="$VG_PREFIX" --callgrind-out-file="$dir/cg.out" \
        "$VALKEY_912/src/valkey-server" --port "$port" --bind "$RDMA_ADDR" 127.0.0.1 --protected-mode no \
        --save "" --appendonly no --dir "$dir" --logfile "$dir/server.log" \
        --loadmodule "$module" --rdma-bind "$RDMA_ADDR" --rdma-port "$port" < /dev/null 2> "$dir/valgrind.log" &
    local vp=$! i
    for i in $(seq 1 300); do
        "$CLI912" -h 127.0.0.1 -p "$port" PING 2>/dev/null | grep -q PONG && break
        kill -0 $vp 2>/dev/null || break
        sleep 0.5
    done
    "$CLI912" -h 127.0.0.1 -p "$port" PING 2>/dev/null | grep -q PONG || { echo "# $impl: the server did not come up under valgrind"; tail -n 5 "$dir/valgrind.log"; return 1; }
    for w in "${WORKLOADS[@]}"; do
        name=${w%%|*} args=${w#*|}
        [ -z "${INSTR_ONLY:-}" ] || [[ ",$INSTR_ONLY," == *",$name,"* ]] || continue
        if [[ $name == get-* ]]; then   # the keys it reads, with values of its size (every workload uses the same keys)
            local d; d=$(sed -n 's/.*-d \([0-9]*\).*/\1/p' <<< "$args")
            timeout 300 "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$port" -c 4 -d "$d" -t set -r 1000 -n 2000 -q > /dev/null 2>&1
        fi
        # shellcheck disable=SC2086
        "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$port" $args -r 1000 -n 100000000 -q > /dev/null 2>&1 &
        local bp=$!
        # Its connections first, then the warm-up: under callgrind on a slow host, 32
        # connections can take longer to set up than the warm-up, and their setup would
        # be counted in the window (the C module's rdmaCreateResource).
        local c; c=$(sed -n 's/.*-c \([0-9]*\).*/\1/p' <<< "$args")
        for i in $(seq 1 240); do
            [ "$(clients_of "$port")" -ge "$c" ] && break
            sleep 0.5
        done
        [ "$(clients_of "$port")" -ge "$c" ] || { echo "# $impl $name: $c connections not up after 120 s"; kill $bp; return 1; }
        sleep "$WARM"
        callgrind_control --vgdb-prefix="$VG_PREFIX" -z $vp > /dev/null
        sleep "$WINDOW"
        callgrind_control --vgdb-prefix="$VG_PREFIX" -d $vp > /dev/null
        kill $bp 2>/dev/null; wait $bp 2>/dev/null
        local dump; dump=$(ls -t "$dir"/cg.out.* 2>/dev/null | head -n1)
        [ -n "$dump" ] || { echo "# $impl $name: no dump"; return 1; }
        echo "{\"impl\": \"$impl\", \"workload\": \"$name\", \"split\": $(python3 "$SPLIT" "$dump")}" >> "$OUT/instructions.jsonl"
        if [ -n "${INSTR_KEEP:-}" ]; then mv "$dump" "$dir/$name.callgrind"; else rm -f "$dump"; fi
    done
    kill $vp; wait $vp 2>/dev/null
}

# INSTR_KEEP=1: keep each window's dump (callgrind_annotate reads it); INSTR_IMPLS: "c ours";
# INSTR_VG_ARGS: more callgrind options (--dump-instr=yes: costs per instruction, which
# callgrind_lines.py maps to the module's source lines);
# INSTR_ONLY=NAME,NAME: only those workloads
rm -f "$OUT/instructions.jsonl"
for impl in ${INSTR_IMPLS:-c ours}; do
    if [ "$impl" = c ]; then measure_impl c "$C_MODULE" || exit 1; else measure_impl ours "$OUR_MODULE" || exit 1; fi
done
python3 - "$OUT/instructions.jsonl" <<'EOF' | tee "$OUT/instructions.md"
import json, re, sys
def short(fn):  # a Rust path without its hash, its last two parts
    return "::".join(re.sub(r"::h[0-9a-f]{16}$", "", fn).split("::")[-2:])
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {(r["impl"], r["workload"]): r["split"] for r in rows}
workloads = list(dict.fromkeys(r["workload"] for r in rows))
def per(split, *groups):
    return sum(split["ir"].get(g, 0) for g in groups) / max(split["requests"], 1)
print("Instructions per request in valkey-server 9.1.2 (user space, callgrind): C module / ours (ratio)\n")
def copies(split):  # libc's block copies (memcpy, memmove): counted by callgrind per byte above a size
    return split.get("copies", 0) / max(split["requests"], 1)
WHOLE = ("module", "rdma-core", "valkey-server", "libc", "other")
print("| workload | requests C / ours | module | module + rdma-core | rdma-core | valkey-server | libc | of which copies | whole process | whole process less copies | completion events |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for w in workloads:
    c, o = by.get(("c", w)), by.get(("ours", w))
    if not c or not o:
        continue
    cells = []
    for a, b in [(per(c, *g), per(o, *g)) for g in [("module",), ("module", "rdma-core"), ("rdma-core",),
                                                    ("valkey-server",), ("libc",)]] + [
            (copies(c), copies(o)), (per(c, *WHOLE), per(o, *WHOLE)),
            (per(c, *WHOLE) - copies(c), per(o, *WHOLE) - copies(o))]:
        cells.append(f"{a:,.0f} / {b:,.0f} ({b / a:.2f})" if a else f"{a:,.0f} / {b:,.0f}")
    # (per request, two decimals: a kernel entry and, on a NIC, an interrupt each; see callgrind_split.py)
    ev = [s.get("cq_events", 0) / max(s["requests"], 1) for s in (c, o)]
    cells.append(f"{ev[0]:.2f} / {ev[1]:.2f}")
    print(f"| {w} | {c['requests']:,} / {o['requests']:,} | " + " | ".join(cells) + " |")
print("\nOur module's top functions (self instructions per request):\n")
for w in workloads:
    o = by.get(("ours", w))
    if not o:
        continue
    top = ", ".join(f"{short(fn)} {ir / max(o['requests'], 1):,.0f}" for fn, ir in o["module_top"][:5])
    print(f"- {w}: {top}")
EOF
echo "results in $OUT"
