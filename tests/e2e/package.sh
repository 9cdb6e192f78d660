#!/bin/bash
# package.sh - the installed Debian package where RDMA is (run by `./runtest-rdma
# --package` after it installed the .deb on the host, whose root the guest shares):
# the reference servers load librdma.so from its installed path and serve RDMA, and
# the installed valkey-rdma-cli's doctor finds everything in order.
. "$(dirname "$(readlink -f "$0")")/lib.sh"
INSTALLED=${INSTALLED_MODULE:-/usr/lib/valkey/modules/librdma.so}

case_installed_module() {  # TREE: the server of TREE loads the installed module and serves RDMA
    local tree=$1
    [ -f "$INSTALLED" ] || { fail "$INSTALLED is not installed"; return 1; }
    start_server pkg "$tree/src/valkey-server" --loadmodule "$INSTALLED" --rdma-bind "$RDMA_ADDR" --rdma-port @PORT@ || return 1
    grep -m1 "RDMA: connection type registered" "$SERVER_LOG" | sed 's/^/# log: /'
    expect_eq "PING over RDMA" "$(timeout 30 "$CLI912" --rdma -h "$RDMA_ADDR" -p "$PORT" PING 2>&1)" PONG || return 1
    expect_eq "the installed client" "$(timeout 30 /usr/bin/valkey-rdma-cli -h "$RDMA_ADDR" -p "$PORT" PING 2>&1)" PONG || return 1
    server_alive
}

case_installed_doctor() {  # /usr/bin/valkey-rdma-cli doctor: no FAIL
    local out rc
    out=$(/usr/bin/valkey-rdma-cli doctor --bind "$RDMA_ADDR" --clients 4 --server "$VALKEY_912/src/valkey-server" 2>&1); rc=$?
    echo "$out" | sed 's/^/# /'
    expect_eq "doctor exit status" "$rc" 0
}

run_case "package: valkey-9.1.2 loads $INSTALLED" case_installed_module "$VALKEY_912"
run_case "package: valkey-8.1.1 loads $INSTALLED" case_installed_module "$VALKEY_811"
run_case "package: the installed doctor" case_installed_doctor
summary
