#!/bin/bash
# package.sh - the installed packages where RDMA is (run by `./runtest-rdma --package`
# after it installed the .deb on the host, whose root the guest shares, and the .rpm into
# a scratch root): the reference servers load librdma.so from its installed path and
# serve RDMA, a valkey.conf that includes the drop-in /etc/valkey/modules/rdma.conf
# serves RDMA, the RPM's rdma.so serves RDMA, and the installed doctor finds everything
# in order.
. "$(dirname "$(readlink -f "$0")")/lib.sh"
INSTALLED=${INSTALLED_MODULE:-/usr/lib/valkey/modules/librdma.so}
DROPIN=${INSTALLED_DROPIN:-/etc/valkey/modules/rdma.conf}

case_installed_module() {  # TREE [MODULE]: the server of TREE loads the installed module and serves RDMA
    local tree=$1 module=${2:-$INSTALLED}
    [ -f "$module" ] || { fail "$module is not installed"; return 1; }
    start_server pkg "$tree/src/valkey-server" --loadmodule "$module" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    grep -m1 "RDMA: connection type registered" "$SERVER_LOG" | sed 's/^/# log: /'
    expect_eq "PING over RDMA" "$(timeout 30 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING 2>&1)" PONG || return 1
    expect_eq "the installed client" "$(timeout 30 /usr/bin/valkey-rdma-cli -h "$RDMA_ADDR" -p "$PORT" PING 2>&1)" PONG || return 1
    server_alive
}

case_dropin() {  # a valkey.conf as Fedora's: `include /etc/valkey/modules/*.conf` first, the rdma-* settings after
    [ -f "$DROPIN" ] || { fail "$DROPIN is not installed"; return 1; }
    sed 's/^/# /' "$DROPIN"
    # the same lines as a valkey.conf, given on the command line (after start_server's own)
    start_server dropin "$VALKEY_912/src/valkey-server" --include "$(dirname "$DROPIN")/*.conf" \
        --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    grep -m1 "RDMA: connection type registered" "$SERVER_LOG" | sed 's/^/# log: /'
    expect_eq "PING over RDMA" "$(timeout 30 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING 2>&1)" PONG || return 1
    server_alive
}

case_installed_doctor() {  # /usr/bin/valkey-rdma-cli doctor: no FAIL
    local out rc
    out=$(/usr/bin/valkey-rdma-cli doctor --bind "$RDMA_ADDR" --clients 4 --server "$VALKEY_912/src/valkey-server" 2>&1); rc=$?
    echo "$out" | sed 's/^/# /'
    expect_eq "doctor exit status" "$rc" 0
}

case_no_test_hooks() {  # the packaged module is built without test hooks: VALKEY_RDMA_TEST makes it refuse to load
    if VALKEY_RDMA_TEST=fail-accept=1 start_server hooks "$VALKEY_912/src/valkey-server" --loadmodule "$INSTALLED" \
        --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ > /dev/null; then
        fail "the packaged module loaded with VALKEY_RDMA_TEST set"; return 1
    fi
    grep "test knobs" "$SERVER_LOG" | sed 's/^/# log: /'
    grep -q "this build has no test knobs" "$SERVER_LOG"
}

run_case "package: valkey-9.1.2 loads $INSTALLED" case_installed_module "$VALKEY_912"
run_case "package: valkey-8.1.1 loads $INSTALLED" case_installed_module "$VALKEY_811"
run_case "package: valkey.conf including the drop-in $DROPIN" case_dropin
if [ -n "${RPM_MODULE:-}" ]; then
    run_case "package: valkey-9.1.2 loads the RPM's rdma.so (scratch root)" case_installed_module "$VALKEY_912" "$RPM_MODULE"
fi
run_case "package: the installed doctor" case_installed_doctor
run_case "package: the packaged module has no test hooks (VALKEY_RDMA_TEST refused)" case_no_test_hooks
summary
