#!/bin/bash
# measure.sh IMPL... - inside the Soft-RoCE guest (testbed/run-in-vm.sh): what a server with
# RDMA clients does when its device is removed (`rdma link delete rxe0`) and added back,
# with a second device (rxe9) and its client beside. IMPL: ours (target/release/librdma.so)
# or c (the upstream module of the 9.1.2 tree). Prints what it saw; asserts nothing.
. "$(dirname "$(readlink -f "$0")")/../../../testbed/env.sh"
CLI=$VALKEY_912/src/valkey-cli
A=$RDMA_ADDR B=10.79.0.1 P=6390
ip link add dummy9 type dummy; ip addr add $B/24 dev dummy9; ip link set dummy9 up
rdma link add rxe9 type rxe netdev dummy9; sleep 2
for impl in "$@"; do
    mod=$PROJECT_ROOT/target/release/librdma.so
    [ "$impl" = c ] && mod=$VALKEY_912/src/valkey-rdma.so
    w=$PWD/measure-$impl; mkdir -p "$w"; P=$((P + 1))
    echo "=== $impl ($mod)"
    "$VALKEY_912/src/valkey-server" --port $P --bind 127.0.0.1 --protected-mode no --save "" \
        --loadmodule "$mod" --rdma-bind $A $B --rdma-port $P --logfile "$w/server.log" --dir "$w" &
    sp=$!; sleep 3
    $CLI --rdma -h $A -p $P -r -1 -i 1 PING > "$w/c1.out" 2>&1 & c1=$!
    $CLI --rdma -h $A -p $P -r -1 -i 1 PING > "$w/c2.out" 2>&1 & c2=$!
    $CLI --rdma -h $B -p $P -r -1 -i 1 INCR n > "$w/c3.out" 2>&1 & c3=$!
    sleep 4
    echo "before: clients $($CLI -p $P INFO clients | tr -d '\r' | sed -n 's/connected_clients://p'), device files: $(ls -l /proc/$sp/fd | grep -oE 'uverbs[0-9]+|infinibandevent' | sort | uniq -c | tr -s ' \n' ' ')"
    (timeout 100 rdma link delete rxe0; echo "rc=$?") > "$w/delete.out" 2>&1 &
    del=$!; t0=$SECONDS
    sleep 10
    echo "10 s after the delete began: delete $( [ -s "$w/delete.out" ] && cat "$w/delete.out" || echo waiting), clients $($CLI -p $P INFO clients | tr -d '\r' | sed -n 's/connected_clients://p'), device files: $(ls -l /proc/$sp/fd | grep -oE 'uverbs[0-9]+|infinibandevent' | sort | uniq -c | tr -s ' \n' ' ')"
    echo "  TCP PING: $(timeout 5 $CLI -p $P PING)  new client on rxe9: $(timeout 10 $CLI --rdma -h $B -p $P PING 2>&1)"
    kill -9 $c1 $c2; wait $c1 $c2 2>/dev/null
    sleep 10
    echo "10 s after the clients on rxe0 were killed: delete $( [ -s "$w/delete.out" ] && cat "$w/delete.out" || echo waiting)"
    if [ ! -s "$w/delete.out" ]; then
        kill -9 $sp; wait $sp 2>/dev/null; wait $del
        echo "  the server killed: delete $(cat "$w/delete.out") after $((SECONDS - t0)) s in all"
    fi
    n1=$($CLI -p $P GET n 2>/dev/null)
    rdma link add rxe0 type rxe netdev dummy0; sleep 8
    if kill -0 $sp 2>/dev/null; then
        echo "8 s after rxe0 came back: PING over RDMA on rxe0: $(timeout 10 $CLI --rdma -h $A -p $P PING 2>&1), n on rxe9 $n1 -> $($CLI -p $P GET n)"
        kill $sp; wait $sp 2>/dev/null
    fi
    kill $c3 2>/dev/null; wait $c3 2>/dev/null
    echo "server log (RDMA and device lines):"
    grep -iE "rdma|device" "$w/server.log" | grep -viE "pinned-memory|registered for|Module 'rdma' loaded|Connection type rdma|cannot be unloaded" | sed 's/^[0-9]*:M //; s/^/  /' | cut -c1-200
    wait $del 2>/dev/null
done
rdma link delete rxe9; ip link delete dummy9
