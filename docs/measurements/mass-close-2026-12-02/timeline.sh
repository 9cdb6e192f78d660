#!/bin/bash
# timeline.sh N BUILD...: for each build (/tmp/ab/librdma-BUILD.so) one idle_capacity run of N
# connections with the close probe's timeline (ms since the stop, ms waited for INFO, clients)
# and the completions the event loop polled from the stop on. Runs in the guest:
#   testbed/run-in-vm.sh -m 8G -t 3000 -- 'bash docs/measurements/mass-close-2026-12-02/timeline.sh 10000 new close'
export E2E_WORK=$PWD
. /work/main/tests/e2e/lib.sh
. /work/main/tests/e2e/idle-capacity.sh
n=$1; shift
for b in "$@"; do
    module_of() { echo "/tmp/ab/librdma-$b.so"; }
    echo "### build $b"
    IDLE_TAG="$b-timeline" IDLE_PROCS=2 IDLE_TIMEOUT=600 IDLE_MAX_MAP_COUNT=262144 idle_capacity "$n" "$b" "$PWD" 2>&1 \
        | grep -E '^idle-capacity|clients up after|server alive|SERVER DIED|from the stop|closed in|second PING|acknowledged nothing' | sort | uniq -c | sed 's/^ *1 //'
    echo "timeline (ms since the stop, ms waited, connected clients):"
    cat "$PWD/idle-$n-$b-$b-timeline.timeline"
done
