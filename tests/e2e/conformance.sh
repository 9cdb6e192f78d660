#!/bin/bash
# conformance.sh [--mode MODES] [PATTERN...] [-- RUNTEST-ARGS...]  |  --report DIR
# Valkey 9.1.2's own Tcl test suite in external-server mode (`runtest --host --port`;
# the suite itself skips the tests tagged external:skip) against one 9.1.2 server per
# test file and mode (a crash or a hang stays with its file), started as upstream's
# external CI does (--save "" --enable-debug-command/-module-command/-protected-configs yes):
#   tcp          TCP straight to the server loaded with librdma.so (RDMA listening too)
#   bridge-ours  through valkey-rdma-bridge (TCP in, RDMA out) to the same kind of server
#   bridge-c     through the bridge to the same server loaded with upstream valkey-rdma.so
#   all          the three above;  plain: TCP to a server without any module (baseline)
# MODES: one of these or several, comma-separated (default all; CONFORMANCE_MODES).
# PATTERN selects test files of `runtest --list-tests`: a unit (unit/type/list), a
# folder (unit/type), or else an extended regex (e.g. 'unit/(multi|pubsub)$'); several
# may be given, or comma-separated. Default: every file. CONFORMANCE_SUBSET=ci: the CI
# list below, with its runtest arguments (and, without --mode, the CI modes); ci-wide:
# the same with the four data-type files CI leaves out.
# Runs where RDMA is (RDMA_ADDR set), cwd writable. Writes into ./conformance/:
#   results.tsv  mode file ok err exc skip seconds note      (one row per file and mode)
#   tests.tsv    mode file status name                       (status ok|err|exc)
#   logs/MODE/FILE.log (runtest output), the server's (and bridge's) log beside it
# and prints a table (file | mode... with ok/err/exc), the tests that pass over TCP and
# fail through the bridge, and those that pass through the bridge to ours and fail to C.
# --report DIR prints that again from an earlier run's DIR (e.g. after editing the
# exceptions), anywhere. In the bridge modes the ipv6-tagged tests are left out.
# Exit status: non-zero when a test passes in tcp and fails in bridge-ours (any failure
# in bridge-ours when tcp did not run) and is not in conformance-exceptions.txt
# (CONFORMANCE_EXCEPTIONS), when a bridge-ours file ends in an exception/timeout that tcp
# did not have, or when a server crashes (any mode). Knobs: CONFORMANCE_FILE_TIMEOUT
# (s per file, default 1800), CONFORMANCE_TEST_TIMEOUT (the suite's --timeout: s without
# progress, default 600), CONFORMANCE_ARGS (runtest arguments, split at blanks, e.g.
# "--tags -slow"; replaces the CI ones), BRIDGE (the bridge binary).
# Everything is inside main(): bash has read it all before it runs, so editing this file
# during a long run cannot change what the run does.
main() {
HERE=$(dirname "$(readlink -f "$0")")
EXCEPTIONS=${CONFORMANCE_EXCEPTIONS:-$HERE/conformance-exceptions.txt}
FILE_TIMEOUT=${CONFORMANCE_FILE_TIMEOUT:-1800}
TEST_TIMEOUT=${CONFORMANCE_TEST_TIMEOUT:-600}

# The CI subset (CONFORMANCE_SUBSET=ci): strings, counters, lists and hashes, transactions,
# pub/sub, the protocol parser, QUIT, and keyspace/scan/expire/info-command; mode
# bridge-ours (tcp as referee);
# runtest --tags -slow, and without the twelve round-trip-bound fuzz/stress tests below
# (pure server logic, thousands of sequential commands each; the full --conformance runs
# them).
# Measured in the TCG guest (2 vCPUs, Soft-RoCE), the 19 files of ci-wide, with the first six skips:
#   1365 tests passed per mode, tcp 187 s, bridge-ours 315 s, bridge-c 322 s. With all
#   twelve (the CI default, 2026-12-01, a host 2.5 times slower): bridge-ours 1359 passed
#   in 588 s.
# Without the six skips (--tags -slow only): tcp 404 s, bridge-ours 753 s (1374 tests).
# (Not in CI: unit/type/set, zset, stream and stream-cgroups, 538 tests of data-structure
# logic whose replies and blocking reads the files below and the reply-shape cases already
# put through the transport; --conformance runs them, CONFORMANCE_SUBSET=ci-wide adds them.)
CI_FILES=(
    unit/type/incr unit/type/string unit/type/list unit/type/list-2 unit/type/list-3
    unit/type/hash
    unit/multi unit/pubsub unit/pubsubshard unit/protocol unit/quit unit/info-command
    unit/keyspace unit/scan unit/expire
)
CI_WIDE_FILES=("${CI_FILES[@]}" unit/type/set unit/type/zset unit/type/stream unit/type/stream-cgroups)
CI_ARGS=(--tags -slow
    --skiptest "/SCAN regression test for issue #4906"   # tcp 38 s, bridge 153 s
    --skiptest "/ZDIFF fuzzing"                          # 59 s, 93 s
    --skiptest "/SDIFF fuzzing"                          # 22 s, 43 s
    --skiptest "/XRANGE fuzzing"                         # 34 s, 34 s
    --skiptest "/XDEL fuzz test"                         # 11 s, 32 s
    --skiptest "/Stress tester for #3343-alike bugs"     # 34 s, 35 s
    # the next six: bridge-ours on 2026-12-01, on a host that ran the whole subset in
    # 816 s (with them) where the first measurement above took 315 s. (Not "XADD mass
    # insertion and XLEN", 47 s: the stream it builds is what the XRANGE/XREAD tests after
    # it read.)
    --skiptest "/Hash fuzzing #[12] - 512 fields"        # 53 s + 39 s
    --skiptest "/SETNX against expired volatile key"     # 40 s
    --skiptest "/XREAD with non empty second stream"     # 40 s
    --skiptest "/ZSET skiplist order consistency when elements are moved"  # 39 s
    --skiptest "/Stress test the hash ziplist -> hashtable encoding conversion")  # 39 s
# CI runs bridge-ours over every file, and tcp only as the referee: over the files that had
# a failure in bridge-ours, to tell a failure of ours from one of the suite in this bed
# (the gate below is the same as with tcp over every file). That saves the tcp pass
# (187 s, 542 s on a slower host) where bridge-ours is clean. CONFORMANCE_MODES=tcp,bridge-ours
# runs both over every file.
CI_MODES="bridge-ours"
REFEREE=

MODES=${CONFORMANCE_MODES:-} PATTERNS=() EXTRA=() REPORT_ONLY=
while [ $# -gt 0 ]; do
    case "$1" in
        --mode) MODES=$2; shift 2 ;;
        --report) REPORT_ONLY=$2; shift 2 ;;   # DIR: report on the results of an earlier run
        --) shift; EXTRA=("$@"); break ;;
        -h|--help) sed -n '2,/^main()/{/^#/p}' "$0"; exit 0 ;;
        -*) echo "conformance.sh: unknown option $1" >&2; exit 2 ;;
        *) PATTERNS+=("$1"); shift ;;
    esac
done
SUITE_ARGS=()   # runtest arguments: CONFORMANCE_ARGS (split at blanks), else the CI ones
# shellcheck disable=SC2206
[ -n "${CONFORMANCE_ARGS+x}" ] && SUITE_ARGS=(${CONFORMANCE_ARGS})
if [ "${CONFORMANCE_SUBSET:-}" = ci ] || [ "${CONFORMANCE_SUBSET:-}" = ci-wide ]; then
    [ -z "$MODES" ] && REFEREE=tcp
    : "${MODES:=$CI_MODES}"
    [ -n "${CONFORMANCE_ARGS+x}" ] || SUITE_ARGS=("${CI_ARGS[@]}")
fi
MODES=${MODES:-all}
[ "$MODES" = all ] && MODES="tcp bridge-ours bridge-c"
MODES=${MODES//,/ }
for m in $MODES; do
    case "$m" in tcp|bridge-ours|bridge-c|plain) ;; *) echo "conformance.sh: unknown mode $m" >&2; exit 2 ;; esac
done
ARGS=("${SUITE_ARGS[@]}" "${EXTRA[@]}")

# --- report (from results.tsv and tests.tsv only, so that --report DIR can redo it) ---
# in_exceptions FILE NAME: listed in conformance-exceptions.txt ("FILE | NAME | reason";
# NAME may be * for the whole file)
in_exceptions() {
    [ -f "$EXCEPTIONS" ] || return 1
    awk -F' [|] ' -v f="$1" -v n="$2" '
        /^[ \t]*(#|$)/ { next }
        { gsub(/^[ \t]+|[ \t]+$/, "", $1); gsub(/^[ \t]+|[ \t]+$/, "", $2)
          if ($1 == f && ($2 == n || $2 == "*")) found = 1 }
        END { exit !found }' "$EXCEPTIONS"
}
# regressions A B: tests ok in mode A and err/exc in mode B (file TAB name TAB status)
regressions() {
    awk -F'\t' -v a="$1" -v b="$2" '
        $1 == a && $3 == "ok" { ok[$2 SUBSEP $4] = 1 }
        $1 == b && $3 != "ok" { bad[$2 SUBSEP $4] = $3 }
        END { for (k in bad) if (k in ok) { split(k, p, SUBSEP); print p[1] "\t" p[2] "\t" bad[k] } }' "$OUT/tests.tsv" | sort
}
has_mode() { [[ " $MODES " == *" $1 "* ]]; }
print_regressions() {  # A B GATE
    local a=$1 b=$2 gate=$3 n=0 f name st
    echo; echo "== tests that pass in $a and fail in $b"
    while IFS=$'\t' read -r f name st; do
        [ -n "$f" ] || continue
        n=$((n + 1))
        if in_exceptions "$f" "$name"; then echo "  $f: $name ($st; known exception)"
        else echo "  $f: $name ($st)"; [ "$gate" = 1 ] && GATE_FAIL=$((GATE_FAIL + 1)); fi
    done <<< "$(regressions "$a" "$b")"
    [ $n = 0 ] && echo "  (none)"
}
report() {
    echo
    echo "== conformance: ok/err/exc per file (runtest ${ARGS[*]:-})"
    awk -F'\t' -v modes="$MODES" '
        NR == 1 { next }
        { c[$1 SUBSEP $2] = $3 "/" $4 "/" $5; if (!($2 in seen)) { seen[$2] = 1; order[++n] = $2 }
          for (i = 3; i <= 5; i++) tot[$1, i] += $i; secs[$1] += $7 }
        END {
            m = split(modes, md, " ")
            printf "%-42s", "file"; for (j = 1; j <= m; j++) printf " | %-14s", md[j]; printf "\n"
            for (i = 1; i <= n; i++) {
                printf "%-42s", order[i]
                for (j = 1; j <= m; j++) { v = c[md[j] SUBSEP order[i]]; printf " | %-14s", (v == "" ? "-" : v) }
                printf "\n"
            }
            printf "%-42s", "total ok/err/exc"
            for (j = 1; j <= m; j++) printf " | %-14s", tot[md[j], 3] "/" tot[md[j], 4] "/" tot[md[j], 5]; printf "\n"
            printf "%-42s", "seconds"
            for (j = 1; j <= m; j++) printf " | %-14s", secs[md[j]]; printf "\n"
        }' "$OUT/results.tsv" | tee "$OUT/table.txt"

    GATE_FAIL=0
    if has_mode tcp && has_mode bridge-ours; then print_regressions tcp bridge-ours 1; fi
    if has_mode bridge-ours && has_mode bridge-c; then print_regressions bridge-ours bridge-c 0; fi
    if has_mode bridge-c && has_mode bridge-ours; then print_regressions bridge-c bridge-ours 0; fi
    if has_mode plain && has_mode tcp; then print_regressions plain tcp 0; fi
    if has_mode bridge-ours && ! has_mode tcp; then
        echo; echo "== tests that fail in bridge-ours (tcp not run: every failure counts; exceptions below)"
        n=0
        while IFS=$'\t' read -r _ f st name; do
            [ -n "$f" ] || continue
            n=$((n + 1))
            if in_exceptions "$f" "$name"; then echo "  $f: $name ($st; known exception)"
            else echo "  $f: $name ($st)"; GATE_FAIL=$((GATE_FAIL + 1)); fi
        done <<< "$(awk -F'\t' '$1 == "bridge-ours" && $3 == "err"' "$OUT/tests.tsv")"
        [ $n = 0 ] && echo "  (none)"
    fi
    # tests of bridge-ours that ended their file (exception, timeout, crash) and did not pass
    # over TCP (those are counted above); forgiven when tcp had an exception in that file too
    if has_mode bridge-ours; then
        while IFS=$'\t' read -r _ f _ name; do
            [ -n "$f" ] || continue
            if has_mode tcp && awk -F'\t' -v f="$f" -v n="$name" '$1 == "tcp" && $2 == f && $4 == n && $3 == "ok" { x = 1 } END { exit !x }' "$OUT/tests.tsv"; then continue; fi
            if has_mode tcp && awk -F'\t' -v f="$f" '$1 == "tcp" && $2 == f && $5 > 0 { x = 1 } END { exit !x }' "$OUT/results.tsv"; then
                echo "  note: bridge-ours $f: exception at '$name', as in tcp"; continue
            fi
            if in_exceptions "$f" "$name"; then echo "  bridge-ours $f: exception at '$name' (known exception)"; continue; fi
            echo "  bridge-ours $f: exception at '$name': $(awk -F'\t' -v f="$f" '$1 == "bridge-ours" && $2 == f { print $8 }' "$OUT/results.tsv")"
            GATE_FAIL=$((GATE_FAIL + 1))
        done <<< "$(awk -F'\t' '$1 == "bridge-ours" && $3 == "exc"' "$OUT/tests.tsv")"
    fi

    echo
    echo "== failed tests per mode (names; also in $OUT/tests.tsv)"
    for mode in $MODES; do
        awk -F'\t' -v m="$mode" '$1 == m && $3 != "ok" { print "  " m "  " $2 ": " $4 " (" $3 ")" }' "$OUT/tests.tsv"
    done
    awk -F'\t' 'NR > 1 { s[$1] += $7; n[$1]++; if (!o[$1]++) m[++k] = $1 }
        END { for (i = 1; i <= k; i++) printf "# time %s: %d s for %d file(s)\n", m[i], s[m[i]], n[m[i]] }' "$OUT/results.tsv"
    echo "results in $OUT (results.tsv, tests.tsv, table.txt, logs/)"
    local crashes; crashes=$(awk -F'\t' 'NR > 1 && $8 ~ /server died/' "$OUT/results.tsv" | wc -l)
    [ "$crashes" -gt 0 ] && echo "conformance: $crashes server crash(es)"
    [ "$GATE_FAIL" -gt 0 ] && echo "conformance: $GATE_FAIL failure(s) in bridge-ours that are not in $(basename "$EXCEPTIONS")"
    # the line runtest-rdma counts: tests passed in every mode run, and what fails the gate
    echo "conformance: $(awk -F'\t' '$3 == "ok"' "$OUT/tests.tsv" | wc -l) passed, $((crashes + GATE_FAIL)) failed"
    if [ "$crashes" = 0 ] && [ "$GATE_FAIL" = 0 ]; then echo "conformance: OK"; return 0; fi
    echo "conformance: FAILED"; return 1
}

if [ -n "$REPORT_ONLY" ]; then
    OUT=$(readlink -f "$REPORT_ONLY")
    [ -f "$OUT/results.tsv" ] && [ -f "$OUT/tests.tsv" ] || { echo "conformance.sh: no results.tsv/tests.tsv in $REPORT_ONLY"; exit 2; }
    MODES=$(awk -F'\t' 'NR > 1 && !s[$1]++ { printf "%s ", $1 }' "$OUT/results.tsv")
    ARGS=(); [ -f "$OUT/args" ] && mapfile -t ARGS < "$OUT/args"
    report; exit $?
fi
. "$HERE/lib.sh"
C_MODULE=$VALKEY_912/src/valkey-rdma.so
OUT=$WORK/conformance
mkdir -p "$OUT/logs"
SUITE=$OUT/suite   # the host tree is read-only: a copy of the suite, its tests/tmp writable
rm -rf "$SUITE"; mkdir -p "$SUITE"
cp -r "$VALKEY_912/runtest" "$VALKEY_912/tests" "$SUITE/"
ln -s "$VALKEY_912/src" "$SUITE/src"; ln -s "$VALKEY_912/utils" "$SUITE/utils"
rm -rf "$SUITE/tests/tmp"; mkdir -p "$SUITE/tests/tmp"
export TERM=dumb   # no colour codes in the output we parse

# --- which files ---
# (no process substitution here: the guest has no /dev/fd)
mapfile -t ALL <<< "$(cd "$SUITE" && ./runtest --list-tests | sort | grep .)"
[ -n "${ALL[0]}" ] || { echo "conformance.sh: runtest --list-tests listed nothing"; exit 1; }
FILES=()
if [ ${#PATTERNS[@]} = 0 ] && [ "${CONFORMANCE_SUBSET:-}" = ci ]; then
    FILES=("${CI_FILES[@]}")
elif [ ${#PATTERNS[@]} = 0 ] && [ "${CONFORMANCE_SUBSET:-}" = ci-wide ]; then
    FILES=("${CI_WIDE_FILES[@]}")
elif [ ${#PATTERNS[@]} = 0 ]; then
    FILES=("${ALL[@]}")
else
    for p in ${PATTERNS[*]//,/ }; do
        p=${p%.tcl}; p=${p#tests/}; p=${p%/}
        got=()
        for f in "${ALL[@]}"; do [ "$f" = "$p" ] && got+=("$f"); done
        [ ${#got[@]} = 0 ] && for f in "${ALL[@]}"; do [[ "$f" == "$p"/* ]] && got+=("$f"); done
        [ ${#got[@]} = 0 ] && mapfile -t got <<< "$(printf '%s\n' "${ALL[@]}" | grep -E -- "$p")"
        [ -z "${got[0]:-}" ] && got=()
        [ ${#got[@]} = 0 ] && { echo "conformance.sh: no test file matches '$p'"; exit 2; }
        FILES+=("${got[@]}")
    done
    mapfile -t FILES <<< "$(printf '%s\n' "${FILES[@]}" | awk '!seen[$0]++')"
fi

note "conformance: valkey $("$VALKEY_912/src/valkey-server" --version | grep -o 'v=[^ ]*'), modes: $MODES, ${#FILES[@]} file(s), runtest args: ${ARGS[*]:-(none)}, per file ${FILE_TIMEOUT}s, RDMA_ADDR=$RDMA_ADDR"
case " $MODES " in *" bridge-"*)
    [ -x "$BRIDGE" ] || { echo "conformance.sh: $BRIDGE is missing (cargo build --release)"; exit 1; } ;;
esac

# The server settings the suite expects of an external server (as upstream's
# .github/workflows/external.yml): DEBUG, MODULE and protected configs allowed, no saving
# (lib.sh's start_server adds --save "" --appendonly no --protected-mode no).
SUITE_SERVER_ARGS=(--enable-protected-configs yes --enable-debug-command yes --enable-module-command yes)
mode_server_args() {  # MODE: sets MARGS
    case "$1" in
        plain) MARGS=() ;;
        tcp|bridge-ours) MARGS=(--loadmodule "$OUR_MODULE" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@) ;;
        bridge-c) MARGS=(--loadmodule "$C_MODULE" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@) ;;
    esac
}


printf '%s\n' "${ARGS[@]}" > "$OUT/args"
printf 'mode\tfile\tok\terr\texc\tskip\tseconds\tnote\n' > "$OUT/results.tsv"
printf 'mode\tfile\tstatus\tname\n' > "$OUT/tests.tsv"

# parse_log MODE FILE LOG SERVER_LOG RC: per-test rows into tests.tsv; sets N_OK N_ERR N_EXC N_SKIP NOTE
parse_log() {
    local mode=$1 file=$2 log=$3 slog=$4 rc=$5 name
    N_OK=$(grep -c '^\[ok\]: ' "$log"); N_ERR=$(grep -c '^\[err\]: ' "$log")
    N_SKIP=$(grep -c '^\[\(skip\|ignore\)\]: ' "$log"); N_EXC=0 NOTE=
    sed -n 's/^\[ok\]: \(.*\) ([0-9]* ms)$/\1/p' "$log" | while IFS= read -r name; do
        printf '%s\t%s\tok\t%s\n' "$mode" "$file" "$name"; done >> "$OUT/tests.tsv"
    sed -n 's/^\[err\]: \(.*\) in tests\/[^ ]*\.tcl$/\1/p' "$log" | while IFS= read -r name; do
        printf '%s\t%s\terr\t%s\n' "$mode" "$file" "$name"; done >> "$OUT/tests.tsv"
    # the test that was running when the file stopped: the suite logs every test's
    # start into the server's log (DEBUG LOG "### Starting test NAME in FILE")
    local current
    current=$(grep -a '### Starting test ' "$slog" 2>/dev/null | tail -n1 | sed 's/.*### Starting test \(.*\) in tests\/[^ ]*\.tcl$/\1/')
    exc() {  # WHY
        N_EXC=$((N_EXC + 1)); NOTE="${NOTE:+$NOTE; }$1"
        printf '%s\t%s\texc\t%s\n' "$mode" "$file" "${current:-(file)}" >> "$OUT/tests.tsv"
    }
    if grep -q '^\[exception\]: ' "$log"; then
        exc "exception: $(grep -m1 '^\[exception\]: ' "$log" | cut -c1-160 | sed 's/^\[exception\]: //')"
    fi
    if grep -q '^\[TIMEOUT\]' "$log"; then
        current=$(sed -n 's/^\*\*\* \[TIMEOUT\]: \(.*\) in tests\/[^ ]*\.tcl$/\1/p' "$log" | head -n1)
        exc "suite timeout (no progress for ${TEST_TIMEOUT}s)"
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        exc "killed after ${FILE_TIMEOUT}s"
    fi
    if [ "$SERVER_DIED" = 1 ]; then
        exc "server died: $(grep -a -m1 -E 'crashed by signal|ASSERTION FAILED|Guru Meditation|panicked' "$slog" | cut -c1-120)"
    fi
    if [ "$N_EXC" = 0 ] && ! grep -q '^Test Summary: ' "$log"; then
        exc "runtest ended without a summary (rc $rc)"
    fi
    [ "$N_EXC" = 0 ] && [ "$rc" != 0 ] && [ "$N_ERR" = 0 ] && NOTE="runtest rc $rc"
    return 0
}

# run_file MODE FILE: a fresh server (and bridge) for one test file
run_file() {
    local mode=$1 file=$2 t0=$SECONDS tport log slog rc=0
    local tag=${file//\//_}
    mkdir -p "$OUT/logs/$mode"
    log="$OUT/logs/$mode/$tag.log"
    SERVER_DIED=0
    mode_server_args "$mode"
    if ! start_server "conf-$mode-$tag" "$VALKEY_912/src/valkey-server" "${SUITE_SERVER_ARGS[@]}" "${MARGS[@]}" > "$log" 2>&1; then
        cat "$log"; slog=$SERVER_LOG
        N_OK=0 N_ERR=0 N_SKIP=0 N_EXC=1 NOTE="server did not start"
        printf '%s\t%s\texc\t%s\n' "$mode" "$file" "(server start)" >> "$OUT/tests.tsv"
        stop_all_servers
    else
        slog=$SERVER_LOG tport=$PORT
        if [[ "$mode" == bridge-* ]]; then
            if BRIDGE_LOG_FILE="$OUT/logs/$mode/$tag.bridge.log" start_bridge "$PORT" >> "$log"; then tport=$BPORT; else rc=125; fi
        fi
        local margs=()
        # The bridge listens on 127.0.0.1 only: the ipv6-tagged tests (connect to ::1 at
        # the same port) cannot run through it, and their exception would end the file
        # (see conformance-exceptions.txt).
        [[ "$mode" == bridge-* ]] && margs=(--tags -ipv6)
        if [ "$rc" = 0 ]; then
            # timeout makes itself a process group: the suite's test client and helper
            # processes are in it, and go with it when the file is over
            ( cd "$SUITE" && exec timeout -k 10 "$FILE_TIMEOUT" ./runtest --host 127.0.0.1 --port "$tport" \
                --single "$file" --timeout "$TEST_TIMEOUT" "${ARGS[@]}" "${margs[@]}" ) >> "$log" 2>&1 < /dev/null &
            local tpid=$!
            wait "$tpid"; rc=$?
            kill -- -"$tpid" 2>/dev/null
        fi
        kill -0 "$SERVER_PID" 2>/dev/null || SERVER_DIED=1
        grep -aqE 'crashed by signal|ASSERTION FAILED|Guru Meditation|panicked' "$SERVER_LOG" && SERVER_DIED=1
        stop_bridge
        stop_all_servers
        cp "$slog" "$OUT/logs/$mode/$tag.server.log" 2>/dev/null
        if [ "$rc" = 125 ]; then
            N_OK=0 N_ERR=0 N_SKIP=0 N_EXC=1 NOTE="bridge did not start"
            printf '%s\t%s\texc\t%s\n' "$mode" "$file" "(bridge start)" >> "$OUT/tests.tsv"
        else
            parse_log "$mode" "$file" "$log" "$slog" "$rc"
        fi
    fi
    local secs=$((SECONDS - t0))
    NOTE=${NOTE//$'\t'/ }
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$file" "$N_OK" "$N_ERR" "$N_EXC" "$N_SKIP" "$secs" "$NOTE" >> "$OUT/results.tsv"
    printf '%-12s %-40s ok %4s  err %3s  exc %s  skip %3s  %5ss %s\n' "$mode" "$file" "$N_OK" "$N_ERR" "$N_EXC" "$N_SKIP" "$secs" "$NOTE"
    grep '^\[err\]: \|^\[exception\]: ' "$log" | cut -c1-200 | sed 's/^/      /'
}

T_START=$SECONDS
declare -A MODE_SECS
for mode in $MODES; do
    t0=$SECONDS
    for f in "${FILES[@]}"; do run_file "$mode" "$f"; done
    MODE_SECS[$mode]=$((SECONDS - t0))
    note "mode $mode: ${#FILES[@]} file(s) in ${MODE_SECS[$mode]} s"
done
if [ -n "$REFEREE" ]; then
    mapfile -t FAILED_FILES <<< "$(awk -F'\t' '$1 == "bridge-ours" && ($4 > 0 || $5 > 0) { print $2 }' "$OUT/results.tsv")"
    [ -z "${FAILED_FILES[0]:-}" ] && FAILED_FILES=()
    if [ ${#FAILED_FILES[@]} -gt 0 ]; then
        note "referee: ${#FAILED_FILES[@]} file(s) with failures in bridge-ours, run over $REFEREE"
        MODES="$MODES $REFEREE"
        for f in "${FAILED_FILES[@]}"; do run_file "$REFEREE" "$f"; done
    else
        note "referee: no failure in bridge-ours, $REFEREE not needed"
    fi
fi

report
}
main "$@"; exit $?
