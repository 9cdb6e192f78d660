#!/bin/bash
# Where a larger RX buffer's preparation goes: strace -T of the background thread (rdma-prepare)
# while 32 connections at pipeline 16 each grow 64 KiB -> 1 MiB, and the latency trace of that run.
export E2E_WORK=$PWD
. /work/main/tests/e2e/lib.sh
V=$VALKEY_912/src
B=/work/main/target/release/valkey-rdma-bench
CLI=/work/main/target/release/valkey-rdma-cli
P=7700
d=$(mktemp -d "$PWD/srv.XXXX")
"$V/valkey-server" --port $P --bind "$RDMA_ADDR" 127.0.0.1 --protected-mode no --save "" --dir "$d" \
   --logfile "$d/log" --loadmodule /tmp/ab-gw/new.so --rdma-bind "$RDMA_ADDR" --rdma-port $P </dev/null &
pid=$!
for i in $(seq 50); do "$V/valkey-cli" -p $P PING >/dev/null 2>&1 && break; sleep 0.2; done
head -c 3000000 /dev/zero | tr '\0' x > "$PWD/big.txt"
timeout 60 "$CLI" -h "$RDMA_ADDR" -p $P -x SET big < "$PWD/big.txt"   # one growth: starts the thread
tid=$(grep -l rdma-prepare /proc/$pid/task/*/comm | cut -d/ -f5)
echo "server $pid, rdma-prepare thread $tid"
strace -T -ttt -o "$PWD/prepare.strace" -p "$tid" &
spid=$!
sleep 2
"$B" -h "$RDMA_ADDR" -p $P -c 32 -P 16 -t set,get -d 64 -n 200000 --warmup 1 --server-pid $pid \
   --latency-trace "$PWD/p16" 2>&1 | grep -E 'req/s|CPU' | head -4
kill $spid; wait $spid 2>/dev/null
"$V/valkey-cli" -p $P INFO rdma | tr -d '\r' | grep -E 'rx_windows_grown|rx_window_max'
kill $pid; wait $pid 2>/dev/null
python3 - "$PWD/prepare.strace" <<'PY'
import re, sys, collections
calls = []
for l in open(sys.argv[1]):
    m = re.match(r'(\d+\.\d+) (\w+)\(.*<(\d+\.\d+)>$', l.strip())
    if m: calls.append((float(m.group(1)), m.group(2), float(m.group(3))))
if not calls: sys.exit("no calls traced")
tot = collections.defaultdict(lambda: [0, 0.0, 0.0])
for t, name, d in calls:
    x = tot[name]; x[0] += 1; x[1] += d; x[2] = max(x[2], d)
busy = sum(d for _, _, d in calls if True)
print("rdma-prepare thread: %d system calls from %.3f s to %.3f s (a span of %.0f ms), %.0f ms inside them"
      % (len(calls), 0, calls[-1][0] - calls[0][0], (calls[-1][0] - calls[0][0]) * 1000, busy * 1000))
for name, (n, s, mx) in sorted(tot.items(), key=lambda kv: -kv[1][1]):
    print("  %-12s %4d calls  %8.1f ms in all  %7.2f ms each  max %7.2f ms" % (name, n, s * 1000, s * 1000 / n, mx * 1000))
PY
python3 /work/main/docs/measurements/p99-handler-order-2026-12-01/clusters.py "$PWD/p16.tsv" | awk '/p99/ || $5 >= 20 || NR < 12'
