#!/bin/bash
# linkdown-guest.sh server IMPL | client SERVER_ADDR PORT - the two guests of linkdown.sh.
# server: a 9.1.2 server with IMPL's module (ours or c) on the wire's rxe0, one idle
#   healthy RDMA client of its own (over the same rxe0, which stays up); writes
#   ./ready once the other guest's connections are in, waits for ./linkdown (the host
#   pulled the other guest's cable), then counts how long until they are closed.
# client: N idle RDMA connections to the server (valkey-benchmark --rdma -I), held
#   until the guest is stopped. Before that, from this other host: PING over RDMA and
#   over TCP to the server guest's second server (port PORT+1, protected mode on, no
#   password), and CLIENT INFO over RDMA to the first; the answers go to ./protected.out.
#   Also from there: PING and CLIENT INFO over RDMA to the server's IPv6 address on the
#   wire (rdma-bind has both families), and a short valkey-benchmark --rdma across the
#   wire (./bench.out).
# Server guest, before the rest: that protected server, asked from the server's own
#   address over RDMA and TCP (lines "# protected mode ...").
set -uo pipefail
. "$(dirname "$(readlink -f "$0")")/lib.sh"
N=20
role=$1
# The wire's IPv6 addresses (unique-local; nodad: usable at once, no duplicate detection).
V6_SERVER=fd00:78::1 V6_CLIENT=fd00:78::2
wire_netdev() { rdma link show rxe0/1 | sed -n 's/.* netdev \([^ ]*\).*/\1/p'; }

if [ "$role" = client ]; then
    server=$2 port=$3
    ip addr add "$V6_CLIENT/64" dev "$(wire_netdev)" nodad
    for _ in $(seq 1 300); do "$CLI912" -h "$server" -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.2; done
    {
        r=$(timeout 20 "$CLI912" --rdma -h "$server" -p $((port + 1)) PING 2>&1 | head -c 40)
        echo "protected_rdma=${r:-<no reply: the connection was closed>}"
        echo "protected_tcp=$(timeout 20 "$CLI912" -h "$server" -p $((port + 1)) PING 2>&1 | head -c 40)"
        echo "client_info=$(timeout 20 "$CLI912" --rdma -h "$server" -p "$port" CLIENT INFO 2>&1 | cut -d' ' -f1-4)"
        echo "ipv6_ping=$(timeout 20 "$CLI912" --rdma -h "$V6_SERVER" -p "$port" PING 2>&1 | head -c 60)"
        echo "ipv6_client_info=$(timeout 20 "$CLI912" --rdma -h "$V6_SERVER" -p "$port" CLIENT INFO 2>&1 | cut -d' ' -f2-3)"
    } > protected.out
    timeout 120 "$BENCH912" --rdma -h "$server" -p "$port" -t set,get -n "${WIRE_BENCH_N:-4000}" -c 4 -q > bench.out 2>&1
    echo "# client guest: the server answers over TCP across the wire; opening $N idle RDMA connections"
    exec "$BENCH912" --rdma -h "$server" -p "$port" -I -c "$N"
fi

impl=$2
ip addr add "$V6_SERVER/64" dev "$(wire_netdev)" nodad
sleep 1   # (rxe adds the address's GID from a work queue)
case "$impl" in
    ours) MODARGS=(--loadmodule "$OUR_MODULE" --rdma-bind "$RDMA_ADDR" "$V6_SERVER" --rdma-port @PORT@) ;;
    c) MODARGS=(--loadmodule "$VALKEY_912/src/valkey-rdma.so" --rdma-bind "$RDMA_ADDR" "$V6_SERVER" --rdma-port @PORT@) ;;
    *) echo "linkdown-guest: unknown module $impl"; exit 2 ;;
esac
# The protected server first (port 6380): protected mode on, no password. Upstream's rule,
# kept: an RDMA client is local when it comes from the server's own address.
NEXT_PORT=6380
start_server "protected-$impl" "$VALKEY_912/src/valkey-server" "${MODARGS[@]}" --protected-mode yes || exit 1
echo "# protected mode ($impl), from the server's own address $RDMA_ADDR: RDMA $(timeout 20 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING 2>&1 | head -c 40), TCP $(timeout 20 "$CLI912" -h "$RDMA_ADDR" -p "$PORT" PING 2>&1 | head -c 40)"
NEXT_PORT=6379
start_server "linkdown-$impl" "$VALKEY_912/src/valkey-server" "${MODARGS[@]}" || exit 1
# connected_clients counts the TCP client that asks, too.
rdma_clients() { echo $(( $("$CLI912" -h 127.0.0.1 -p "$PORT" INFO clients | tr -d '\r' | sed -n 's/^connected_clients://p') - 1 )); }
RDMA_CLI=$PROJECT_ROOT/target/release/valkey-rdma-cli
timeout 200 "$RDMA_CLI" -h "$RDMA_ADDR" -p "$PORT" --then-idle 150 PING > "$WORK/healthy.out" 2>&1 &
healthy=$!
want=$((N + 1))
for _ in $(seq 1 900); do [ "$(rdma_clients)" = "$want" ] && break; sleep 0.2; done
[ "$(rdma_clients)" = "$want" ] || { echo "FAIL: $(rdma_clients) RDMA clients, not $want, before the cable was pulled"; exit 1; }
echo "# server guest ($impl): $want RDMA clients connected ($N across the wire, 1 local idle)"
touch ready
# First a blip: the host pulls the cable for a few seconds and plugs it back (./blip once it
# is back). A link back within 6.9 s loses no connection (docs/protocol.md §5); one that
# cost connections has them closed within 12 s of the blip's start.
for _ in $(seq 1 600); do [ -e blip ] && break; sleep 0.1; done
[ -e blip ] || { echo "FAIL: the host never signalled the blip"; exit 1; }
sleep 12
blip_left=$(rdma_clients)
echo "# $impl: 12 s after a cable pull and plug: $blip_left of $want RDMA clients connected"
touch ready2
for _ in $(seq 1 600); do [ -e linkdown ] && break; sleep 0.1; done
[ -e linkdown ] || { echo "FAIL: the host never pulled the cable"; exit 1; }
t0=$(date +%s.%N)
LIMIT=${LINKDOWN_WAIT:-60}
gone=
while :; do
    n=$(rdma_clients)
    el=$(echo "$(date +%s.%N) - $t0" | bc)
    if [ "$n" -le 1 ]; then gone=$el; break; fi
    awk -v e="$el" -v l="$LIMIT" 'BEGIN { exit !(e >= l) }' && break
    sleep 0.2
done
left=$(rdma_clients)
if [ -n "$gone" ]; then
    printf '# %s: the %d connections of the peer whose cable was pulled closed after %.1f s\n' "$impl" "$N" "$gone"
else
    echo "# $impl: $((left - 1)) of the $N connections of the peer whose cable was pulled still open after $LIMIT s"
fi
grep -c "closing the connection" "$SERVER_LOG" | sed 's/^/# log lines "closing the connection": /'
grep "closing the connection" "$SERVER_LOG" | head -n 2 | sed 's/^/# log: /'
[ "$impl" = ours ] && "$CLI912" -h 127.0.0.1 -p "$PORT" INFO rdma | tr -d '\r' | grep "^rdma_errors" | sed 's/^/# /'
kill -0 "$healthy" 2>/dev/null && alive=yes || alive=no
echo "# the local idle healthy client: reply $(cat "$WORK/healthy.out"), still running: $alive"
kill "$healthy" 2>/dev/null; wait "$healthy" 2>/dev/null
server_alive || { echo "FAIL: the server died"; exit 1; }
# left counts the local healthy client: 1 when only it remains.
echo "RESULT impl=$impl blip_kept=$blip_left/$want closed_after=${gone:-none} peer_left=$((left - 1)) local_left=$((left > 0 ? 1 : 0)) healthy=$(cat "$WORK/healthy.out")"
