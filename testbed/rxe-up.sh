#!/bin/bash
# rxe-up.sh [ADDR/PREFIX [wire]] - inside the guest: a dummy interface with an address that
# exists only in the guest, and a Soft-RoCE device (rxe0) on it. With "wire": rxe0 on
# the guest's NIC instead (run-in-vm.sh -w joins two guests by it). Server and clients then
# both use ADDR; rxe loops same-GID traffic back internally. (rxe on lo accepts the link
# but rdma_cm cannot resolve a route over it; rxe across network namespaces fails in
# these kernels. See docs/testbed.md.)
set -e
ADDR=${1:-10.77.0.1/24}
if [ "${2:-}" = wire ]; then
    NETDEV=
    for d in /sys/class/net/*; do [ -e "$d/device" ] && { NETDEV=${d##*/}; break; }; done
    [ -n "$NETDEV" ] || { echo "rxe-up: no NIC in the guest" >&2; ls /sys/class/net >&2; exit 1; }
else
    NETDEV=dummy0
    ip link add dummy0 type dummy
fi
ip addr add "$ADDR" dev "$NETDEV"
ip link set "$NETDEV" up
rdma link add rxe0 type rxe netdev "$NETDEV"
for _ in $(seq 50); do
    rdma link show rxe0/1 | grep -q "state ACTIVE" && exit 0
    sleep 0.1
done
echo "rxe-up: rxe0 did not become ACTIVE" >&2; rdma link show >&2; exit 1
