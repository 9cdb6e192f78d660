#!/bin/bash
# run.sh [LINES]: the core and driver's instructions per request on the host (README.md): appends
# harness.rs to src/protocol/driver.rs, builds the unit tests, counts one request loop with
# callgrind, restores the files, and prints the top source lines per request. The scheduler's
# test-build check (every step also walked on a clone, `Conn::next_step`) is left out of the count.
set -euo pipefail
HERE=$(dirname "$(readlink -f "$0")")
cd "$HERE/../../.."
cp src/protocol/driver.rs /tmp/driver.rs.saved
cp src/protocol/conn/scheduler.rs /tmp/scheduler.rs.saved
trap 'cp /tmp/driver.rs.saved src/protocol/driver.rs; cp /tmp/scheduler.rs.saved src/protocol/conn/scheduler.rs' EXIT
cat "$HERE/harness.rs" >> src/protocol/driver.rs
sed -i 's/^        #\[cfg(test)\]$/        #[cfg(any())]/' src/protocol/conn/scheduler.rs
B=$(cargo test --release --lib --no-run --message-format=json 2>/dev/null | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n1)
N=10000
HARNESS_N=$N valgrind --tool=callgrind --callgrind-out-file=/tmp/harness-cg.out --toggle-collect='*instr_harness::request' \
    "$B" --ignored --exact protocol::driver::instr_harness::harness_request --test-threads 1 2>&1 | grep -E "Collected|test result"
callgrind_annotate --inclusive=no /tmp/harness-cg.out 2>/dev/null | grep -E "^ *[0-9,]+ " | head -"${1:-15}" \
    | awk -v n=$N '{gsub(",","",$1); printf "%8.1f  %s\n", $1/n, substr($0, index($0,$3))}' | cut -c1-180
