#!/bin/bash
# ab.sh N ROUNDS: N idle RDMA connections held by one 9.1.2 server, then closed at once by
# their two client processes; the teardown on the event loop (old: 377e274) against the
# teardown on the rdma-release thread (new), alternating. Each run prints how long the
# server kept a TCP client waiting while the RDMA clients left (close_probe).
# Needs /tmp/ab/librdma-377e274.so and /tmp/ab/librdma-new.so; runs in the guest:
#   testbed/run-in-vm.sh -m 8G -t 3600 -- 'bash docs/measurements/mass-close-2026-12-02/ab.sh 10000 2'
export E2E_WORK=$PWD
. /work/main/tests/e2e/lib.sh
. /work/main/tests/e2e/idle-capacity.sh
n=${1:-10000} rounds=${2:-2}
for r in $(seq 1 "$rounds"); do
    for b in 377e274 new; do
        [ $((r % 2)) = 0 ] && b=$([ "$b" = new ] && echo 377e274 || echo new)
        module_of() { echo "/tmp/ab/librdma-$b.so"; }
        echo "### round $r, build $b"
        IDLE_TAG="$b-r$r" IDLE_PROCS=2 IDLE_TIMEOUT=600 IDLE_MAX_MAP_COUNT=262144 idle_capacity "$n" "$b" "$PWD" 2>&1 \
            | grep -E '^idle-capacity|clients up after|server alive|SERVER DIED|while the clients closed|closed in'
    done
done
