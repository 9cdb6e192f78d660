#!/bin/bash
# profile.sh N BUILD: one idle_capacity run of N connections with /tmp/ab/librdma-BUILD.so,
# the server sampled by `perf record` (cpu-clock, call graphs) from the stop for 45 s: where the
# event loop's time goes while the clients PING once more and then all close. Runs in the guest:
#   testbed/run-in-vm.sh -m 8G -t 1800 -- 'bash docs/measurements/mass-close-2026-12-02/profile.sh 10000 close'
export E2E_WORK=$PWD
. /work/main/tests/e2e/lib.sh
. /work/main/tests/e2e/idle-capacity.sh
n=$1 b=$2
module_of() { echo "/tmp/ab/librdma-$b.so"; }
stop="$PWD/idle-$n-$b-$b-profile.stop"
(
    while [ ! -e "$stop" ]; do sleep 0.2; done
    pid=$(pgrep -n -x valkey-server)
    perf record -q -g -e cpu-clock -F 250 -p "$pid" -o "$PWD/perf.data" -- sleep 45 > /dev/null 2>&1
) &
prof=$!
IDLE_TAG="$b-profile" IDLE_PROCS=2 IDLE_TIMEOUT=600 IDLE_MAX_MAP_COUNT=262144 idle_capacity "$n" "$b" "$PWD" 2>&1 \
    | grep -E '^idle-capacity|server alive|SERVER DIED|from the stop|closed in|second PING'
wait $prof
echo "timeline:"; cat "$PWD/idle-$n-$b-$b-profile.timeline"
echo "### by thread"
perf report -i "$PWD/perf.data" --no-children --sort comm --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -n 12
echo "### by symbol, all threads (self)"
perf report -i "$PWD/perf.data" --no-children --sort comm,dso,sym --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -n 45
echo "### main thread, callers (children)"
perf report -i "$PWD/perf.data" --children --comm valkey-server --sort sym --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -n 45
