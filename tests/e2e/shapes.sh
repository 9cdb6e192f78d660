# shapes.sh - reply shapes that Valkey users run (sourced by suite.sh): replies of many
# blocks from 64 KiB to 64 MiB (LRANGE, HGETALL, SMEMBERS, ZRANGE WITHSCORES, MGET), a
# pipeline of thousands of small replies, CLIENT LIST with hundreds of clients. Each is
# fetched over TCP (the reference bytes), then over RDMA with valkey-cli --rdma and with
# our valkey-rdma-cli, and compared. Speed is not asserted here: the benchmark reports it
# (valkey-rdma-bench -t lrange_10000,hgetall); a stall shows up as the timeout below.

RCLI_SHAPES=$PROJECT_ROOT/target/release/valkey-rdma-cli
SHAPE_TIMEOUT=${SHAPE_TIMEOUT:-180}

# fill_shapes: the keys every shape reads, made server-side (one EVAL each) so that
# filling costs no round trips; every element differs from the others.
fill_shapes() {
    local c=("$CLI912" -p "$PORT")
    "${c[@]}" EVAL "for i=1,tonumber(ARGV[1]) do server.call('RPUSH', KEYS[1], string.rep('e', 90)..string.format('%010d', i)) end" 1 list:75k 700 > /dev/null &&
    "${c[@]}" EVAL "for i=1,tonumber(ARGV[1]) do server.call('RPUSH', KEYS[1], string.rep('e', 90)..string.format('%010d', i)) end" 1 list:4m 40000 > /dev/null &&
    "${c[@]}" EVAL "local b=string.rep('v', 4086) for i=1,tonumber(ARGV[1]) do server.call('RPUSH', KEYS[1], string.format('%010d', i)..b) end" 1 list:64m 16384 > /dev/null &&
    "${c[@]}" EVAL "for i=1,tonumber(ARGV[1]) do server.call('HSET', KEYS[1], 'field:'..i, string.rep('e', 90)..string.format('%010d', i)) end" 1 hash:20k 20000 > /dev/null &&
    "${c[@]}" EVAL "for i=1,tonumber(ARGV[1]) do server.call('SADD', KEYS[1], string.rep('e', 90)..string.format('%010d', i)) end" 1 set:20k 20000 > /dev/null &&
    "${c[@]}" EVAL "for i=1,tonumber(ARGV[1]) do server.call('ZADD', KEYS[1], i / 7, string.rep('e', 90)..string.format('%010d', i)) end" 1 zset:20k 20000 > /dev/null &&
    "${c[@]}" EVAL "for i=1,tonumber(ARGV[1]) do server.call('SET', 'str:'..i, string.rep('e', 90)..string.format('%010d', i)) end" 0 10000 > /dev/null &&
    expect_eq "keys filled (6 collections and 10,000 strings)" "$("${c[@]}" DBSIZE)" 10006
}

# same_over_rdma NAME CMD...: the reply's bytes (as valkey-cli prints them, raw) are
# the same over TCP, over RDMA with valkey-cli, and over RDMA with our client.
same_over_rdma() {
    local name=$1; shift
    local tcp cli ours size t0=$SECONDS
    timeout "$SHAPE_TIMEOUT" "$CLI912" -p "$PORT" "$@" > "$WORK/shape.tcp"
    tcp=$(md5sum < "$WORK/shape.tcp"); size=$(wc -c < "$WORK/shape.tcp"); rm -f "$WORK/shape.tcp"
    cli=$(timeout "$SHAPE_TIMEOUT" "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" "$@" | md5sum)
    ours=$(timeout "$SHAPE_TIMEOUT" "$RCLI_SHAPES" -t "$SHAPE_TIMEOUT" -h "$RDMA_ADDR" -p "$PORT" "$@" | md5sum)
    echo "# $name: $size bytes printed ($((SECONDS - t0)) s for the three)"
    [ "$size" -gt 1000 ] || { fail "$name: the TCP reference is only $size bytes"; return 1; }
    expect_eq "$name through valkey-cli --rdma" "$cli" "$tcp" || return 1
    expect_eq "$name through our client" "$ours" "$tcp"
}

case_reply_shapes() {  # TREE IO_THREADS: multi-block replies, pipelines, CLIENT LIST over RDMA
    local tree=$1 threads=$2
    rdma_server_args "$tree"
    start_server shapes "$tree/src/valkey-server" "${SARGS[@]}" --io-threads "$threads" || return 1
    fill_shapes || { fail "could not fill the keys"; return 1; }
    same_over_rdma "LRANGE of 700 x 100 B (75 KB)" LRANGE list:75k 0 -1 || return 1
    same_over_rdma "LRANGE of 40,000 x 100 B (4 MB)" LRANGE list:4m 0 -1 || return 1
    same_over_rdma "LRANGE of 16,384 x 4 KiB (64 MiB)" LRANGE list:64m 0 -1 || return 1
    same_over_rdma "HGETALL of 20,000 fields" HGETALL hash:20k || return 1
    same_over_rdma "SMEMBERS of 20,000" SMEMBERS set:20k || return 1
    same_over_rdma "ZRANGE 0 -1 WITHSCORES of 20,000" ZRANGE zset:20k 0 -1 WITHSCORES || return 1
    local keys; readarray -t keys <<< "$(seq -f 'str:%g' 1 10000)"
    same_over_rdma "MGET of 10,000 keys" MGET "${keys[@]}" || return 1

    # a pipeline of 5,000 small replies: ours sends all at once and the replies are
    # compared; valkey-benchmark pipelines 1,000 at a time (valkey-cli --pipe cannot run
    # over RDMA: it reads and writes the socket fd itself)
    seq -f 'GET str:%g' 1 5000 > "$WORK/pipeline.txt"
    local want got
    want=$("$CLI912" -p "$PORT" < "$WORK/pipeline.txt" | md5sum)
    got=$(timeout "$SHAPE_TIMEOUT" "$RCLI_SHAPES" -h "$RDMA_ADDR" -p "$PORT" --pipeline < "$WORK/pipeline.txt" | md5sum)
    expect_eq "5,000 pipelined GETs through our client" "$got" "$want" || return 1
    timeout "$SHAPE_TIMEOUT" "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -t get -P 1000 -n 20000 -c 2 -q > "$WORK/p1000.log" 2>&1
    got=$(bench_rps "$WORK/p1000.log" GET); echo "# valkey-benchmark --rdma -P 1000: ${got:-none} req/s"
    awk -v r="${got:-0}" 'BEGIN { exit !(r > 0) }' || { fail "no rate from valkey-benchmark -P 1000"; return 1; }

    # CLIENT LIST with hundreds of (idle RDMA) clients
    timeout 300 "$BENCH912" --rdma -h "$RDMA_ADDR" -p "$PORT" -c 300 -I > /dev/null 2>&1 &
    local idle=$! n=0
    for _ in $(seq 1 150); do
        n=$("$CLI912" -p "$PORT" INFO clients | tr -d '\r' | sed -n 's/^connected_clients://p')
        [ "${n:-0}" -ge 301 ] && break; sleep 0.2
    done
    echo "# connected clients: $n"
    local lines_cli lines_ours
    lines_cli=$(timeout 60 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" CLIENT LIST | grep -c '^id=')
    lines_ours=$(timeout 60 "$RCLI_SHAPES" -h "$RDMA_ADDR" -p "$PORT" CLIENT LIST | grep -c '^id=')
    kill "$idle" 2>/dev/null; wait "$idle" 2>/dev/null
    echo "# CLIENT LIST lines: valkey-cli --rdma $lines_cli, our client $lines_ours"
    [ "${n:-0}" -ge 301 ] || { fail "only ${n:-0} clients connected"; return 1; }
    [ "$lines_cli" -ge 301 ] && [ "$lines_ours" -ge 301 ] || { fail "CLIENT LIST cut short"; return 1; }
    server_alive
}

# The C module passes these too (run with E2E_SHAPES_REFERENCE=1); the suite runs them
# for ours only, to keep CI within its time.
if [ "$IMPL" = ours ] || [ -n "${E2E_SHAPES_REFERENCE:-}" ]; then
    run_case "$IMPL valkey-9.1.2 reply shapes, io-threads 1" case_reply_shapes "$VALKEY_912" 1
    run_case "$IMPL valkey-9.1.2 reply shapes, io-threads 4" case_reply_shapes "$VALKEY_912" 4
fi
