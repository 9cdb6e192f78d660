#!/bin/bash
# rxe-up.sh [ADDR/PREFIX] - inside the guest: a dummy interface with an address that
# exists only in the guest, and a Soft-RoCE device (rxe0) on it. Server and clients then
# both use ADDR; rxe loops same-GID traffic back internally. (rxe on lo accepts the link
# but rdma_cm cannot resolve a route over it; rxe across network namespaces fails in
# these kernels. See README "Test bed".)
set -e
ADDR=${1:-10.77.0.1/24}
ip link add dummy0 type dummy
ip addr add "$ADDR" dev dummy0
ip link set dummy0 up
rdma link add rxe0 type rxe netdev dummy0
for _ in $(seq 50); do
    rdma link show rxe0/1 | grep -q "state ACTIVE" && exit 0
    sleep 0.1
done
echo "rxe-up: rxe0 did not become ACTIVE" >&2; rdma link show >&2; exit 1
