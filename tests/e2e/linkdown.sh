#!/bin/bash
# linkdown.sh [ours|c ...] - a peer whose RDMA link goes down (docs/protocol.md §5), with
# two guests: one runs the server, the other holds 20 idle RDMA connections to it
# (valkey-benchmark --rdma -I) across a virtio wire between them (run-in-vm.sh -w; rxe
# on that NIC in each guest, so the traffic really crosses it). Once the connections
# are in, the host pulls the client guest's cable (QEMU monitor: set_link wire off) and
# the server guest measures how long until the server has closed them, while its own
# local idle connection stays. Before that, a blip: the cable pulled for LINKDOWN_BLIP s (5;
# longer than one keepalive period, and with the QEMU monitor's own delays near the 6.9 s a link may
# stay away, docs/protocol.md §5) and plugged back must cost no connection (idle healthy peers are
# never taken for dead). ours must close them within LINKDOWN_BOUND s (20); the
# C module is measured as the reference (it is not required to notice).
# Runs on the host; takes the guest lock (two guests at once: one vCPU each).
set -uo pipefail
HERE=$(dirname "$(readlink -f "$0")")
. "$HERE/../../testbed/env.sh"
IMPLS=("$@"); [ ${#IMPLS[@]} -gt 0 ] || IMPLS=(ours c)
BOUND=${LINKDOWN_BOUND:-20}
BLIP=${LINKDOWN_BLIP:-5}
SERVER_ADDR=10.78.0.1 CLIENT_ADDR=10.78.0.2
exec 9> /tmp/valkey-rdma-guest.lock
flock 9
"$TESTBED_SCRIPTS/prepare-guest.sh" >/dev/null 2>&1 || "$TESTBED_SCRIPTS/prepare-guest.sh" || exit 125
FAILED=0 PASSED=0
declare -A RPS   # "impl test" -> requests per second across the wire
monitor() {  # monitor SOCKET COMMAND: one command to a QEMU human monitor
    python3 - "$1" "$2" <<'PY'
import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(2)
time.sleep(0.3); s.recv(4096)
s.sendall((sys.argv[2] + "\n").encode()); time.sleep(0.5)
out = s.recv(65536).decode(errors="replace").replace("\r", "")
# the monitor echoes the command (with terminal escapes) and prompts: keep the answer
import re
lines = [re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", l).strip() for l in out.splitlines()]
print(" / ".join(l for l in lines if l and not l.startswith("(qemu)") and sys.argv[2] not in l))
PY
}
for impl in "${IMPLS[@]}"; do
    D=$(mktemp -d "$TESTBED/runs/linkdown.XXXXXX")
    echo "--- linkdown $impl (run folders $D/server, $D/client)"
    "$TESTBED_SCRIPTS/run-in-vm.sh" -s 1 -m 2G -t 400 -r "$D/server" -w "server:$D/wire" -a "$SERVER_ADDR" -- \
        "LINKDOWN_WAIT=60 bash $HERE/linkdown-guest.sh server $impl" > "$D/server.out" 2>&1 &
    spid=$!
    for _ in $(seq 1 100); do [ -S "$D/wire" ] && break; sleep 0.1; done
    "$TESTBED_SCRIPTS/run-in-vm.sh" -s 1 -m 2G -t 400 -r "$D/client" -w "client:$D/wire" -a "$CLIENT_ADDR" -- \
        "bash $HERE/linkdown-guest.sh client $SERVER_ADDR 6379" > "$D/client.out" 2>&1 &
    cpid=$!
    pulled=no
    for _ in $(seq 1 3000); do
        [ -e "$D/server/ready" ] && break
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.1
    done
    if [ -e "$D/server/ready" ]; then
        monitor "$D/client/monitor.sock" "set_link wire off" > /dev/null; sleep "$BLIP"
        monitor "$D/client/monitor.sock" "set_link wire on" > /dev/null
        echo "# blip: the client guest's cable pulled for $BLIP s and plugged back (QEMU monitor set_link)"
        touch "$D/server/blip"
        for _ in $(seq 1 600); do [ -e "$D/server/ready2" ] && break; kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
    fi
    if [ -e "$D/server/ready2" ]; then
        echo "# cable pulled: set_link wire off on the client guest's QEMU monitor$(monitor "$D/client/monitor.sock" "set_link wire off" | sed 's/^./ (it answered: &/; s/.$/&)/')"
        touch "$D/server/linkdown"; pulled=yes
    fi
    wait "$spid"; src=$?
    kill "$cpid" 2>/dev/null; wait "$cpid" 2>/dev/null
    cat "$D/server.out"
    [ "$pulled" = yes ] || { echo "# client guest output:"; tail -n 20 "$D/client.out"; }
    res=$(grep '^RESULT ' "$D/server.out")
    ok=1
    [ "$src" = 0 ] && [ -n "$res" ] || ok=0
    if [ "$impl" = ours ] && [ $ok = 1 ]; then
        after=$(sed -n 's/.*closed_after=\([0-9.]*\).*/\1/p' <<< "$res")
        [ -n "$after" ] && awk -v a="$after" -v b="$BOUND" 'BEGIN { exit !(a < b) }' || { echo "FAIL: ours did not close the peer's connections within $BOUND s"; ok=0; }
        grep -q 'peer_left=0 local_left=1 healthy=PONG' <<< "$res" || { echo "FAIL: want the peer's connections gone and the local idle one kept"; ok=0; }
        grep -q 'blip_kept=21/21 ' <<< "$res" || { echo "FAIL: a $BLIP-second blip cost connections"; ok=0; }
    fi
    if [ $ok = 1 ]; then PASSED=$((PASSED + 1)); echo "ok - linkdown $impl"
    else FAILED=$((FAILED + 1)); echo "not ok - linkdown $impl"; fi
    # Protected mode across hosts (docs/server-abi.md §4.6): a client on the other guest
    # is refused over RDMA as over TCP; one from the server's own address is served;
    # CLIENT INFO shows the other host's address.
    sed 's/^/# client guest: /' "$D/client/protected.out" 2>/dev/null
    local_line=$(grep -o "# protected mode.*" "$D/server.out")
    pok=1
    # over RDMA the DENIED text cannot go out before the client's first RegisterXferMemory
    # (the server writes it at accept): refused shows as the connection closed
    grep -q "^protected_rdma=." "$D/client/protected.out" 2>/dev/null || pok=0
    grep -q "^protected_rdma=PONG" "$D/client/protected.out" 2>/dev/null && pok=0
    grep -q "^protected_tcp=DENIED" "$D/client/protected.out" 2>/dev/null || pok=0
    grep -q "^client_info=id=[0-9]* addr=$CLIENT_ADDR:" "$D/client/protected.out" 2>/dev/null || pok=0
    grep -q "RDMA PONG" <<< "$local_line" || pok=0
    if [ "$impl" = ours ]; then
        if [ $pok = 1 ]; then PASSED=$((PASSED + 1)); echo "ok - protected mode across hosts $impl"
        else FAILED=$((FAILED + 1)); echo "not ok - protected mode across hosts $impl (want refused over RDMA and DENIED over TCP from the other host, PONG over RDMA from the server's own address, CLIENT INFO addr=$CLIENT_ADDR)"; fi
    else
        echo "# protected mode across hosts, $impl (measured, not required): $([ $pok = 1 ] && echo as ours || echo differs)"
    fi
    # IPv6 across the wire: rdma-bind on the server's unique-local address of the wire.
    v6ok=1
    grep -q "^ipv6_ping=PONG" "$D/client/protected.out" 2>/dev/null || v6ok=0
    grep -q "^ipv6_client_info=addr=\[fd00:78::2\]:[0-9]* laddr=\[fd00:78::1\]:6379" "$D/client/protected.out" 2>/dev/null || v6ok=0
    if [ "$impl" = ours ]; then
        if [ $v6ok = 1 ]; then PASSED=$((PASSED + 1)); echo "ok - IPv6 across hosts $impl"
        else FAILED=$((FAILED + 1)); echo "not ok - IPv6 across hosts $impl (want PONG from fd00:78::1 and CLIENT INFO addr=[fd00:78::2]:PORT laddr=[fd00:78::1]:6379)"; fi
    else
        echo "# IPv6 across hosts, $impl (measured, not required): $([ $v6ok = 1 ] && echo as ours || echo differs)"
    fi
    for t in SET GET; do
        RPS["$impl $t"]=$(tr '\r' '\n' < "$D/client/bench.out" 2>/dev/null | grep "^$t: " | tail -n1 | sed -E 's/^[^:]*: ([0-9.]+) requests per second.*/\1/')
        echo "# across the wire, $impl: $t ${RPS["$impl $t"]:-none} requests per second (valkey-benchmark --rdma -c 4, ${WIRE_BENCH_N:-4000} requests)"
    done
done
if [ -n "${RPS["ours SET"]:-}" ] && [ -n "${RPS["c SET"]:-}" ]; then
    for t in SET GET; do
        awk -v o="${RPS["ours $t"]}" -v c="${RPS["c $t"]}" -v t="$t" 'BEGIN { if (c > 0) printf "# across the wire, ours/C %s: %.3f (one run each under TCG: a smoke figure, not a ratio with its noise)\n", t, o / c }'
    done
fi
echo "linkdown: $PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
