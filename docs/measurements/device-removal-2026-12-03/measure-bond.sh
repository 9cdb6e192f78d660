#!/bin/bash
# measure-bond.sh IMPL... - inside the Soft-RoCE guest: a bond fails over to a slave with
# another MAC (RDMA_CM_EVENT_ADDR_CHANGE) under a server listening on the bond's address, with
# one RDMA client. IMPL: ours or c. Prints what it saw; asserts nothing.
. "$(dirname "$(readlink -f "$0")")/../../../testbed/env.sh"
CLI=$VALKEY_912/src/valkey-cli
A=10.80.0.1 P=6390
ip link add bond8 type bond mode active-backup fail_over_mac active
ip link add dummy8a type dummy; ip link add dummy8b type dummy
ip link set dummy8a master bond8; ip link set dummy8b master bond8
ip link set bond8 up; ip addr add $A/24 dev bond8
rdma link add rxe8 type rxe netdev bond8; sleep 2
for impl in "$@"; do
    mod=$PROJECT_ROOT/target/release/librdma.so
    [ "$impl" = c ] && mod=$VALKEY_912/src/valkey-rdma.so
    w=$PWD/bond-$impl; mkdir -p "$w"; P=$((P + 1))
    echo "=== $impl"
    "$VALKEY_912/src/valkey-server" --port $P --bind 127.0.0.1 --protected-mode no --save "" \
        --loadmodule "$mod" --rdma-bind $A --rdma-port $P --logfile "$w/server.log" --dir "$w" &
    sp=$!; sleep 3
    $CLI --rdma -h $A -p $P -r -1 -i 1 PING > "$w/c1.out" 2>&1 & c1=$!
    sleep 3
    active=dummy8b; [ "$(cat /sys/class/net/bond8/bonding/active_slave)" = dummy8b ] && active=dummy8a
    echo "$active" > /sys/class/net/bond8/bonding/active_slave
    sleep 5
    echo "5 s after the failover to $active: clients $($CLI -p $P INFO clients | tr -d '\r' | sed -n 's/connected_clients://p'), a new client over RDMA: $(timeout 10 $CLI --rdma -h $A -p $P PING 2>&1 | head -c 60)"
    kill $c1 2>/dev/null; wait $c1 2>/dev/null
    kill $sp; wait $sp 2>/dev/null
    echo "server log (RDMA and address lines):"
    grep -iE "rdma|addr" "$w/server.log" | grep -viE "pinned-memory|registered for|Module 'rdma' loaded|Connection type rdma|cannot be unloaded|OnUnload|unload module" | sed 's/^[0-9]*:M //; s/^/  /' | cut -c1-200
done
rdma link delete rxe8; ip link delete bond8; ip link delete dummy8a; ip link delete dummy8b
