#!/usr/bin/env python3
"""syscalls.py DUMP... - system calls per request of valkey-server, by the function that
made the call, from callgrind dumps taken with --collect-systime=yes (instructions.sh:
INSTR_VG_ARGS=--collect-systime=yes INSTR_KEEP=1).

Each call record's inclusive sysCount is what its callee did in the kernel on behalf of
that caller; the callers of libc's system-call wrappers are listed with what each call
means for a real NIC. Requests: calls of processCommand, as in callgrind_split.py.
"""
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../tests/e2e"))
from callgrind_split import Requests, walk  # noqa: E402

# (caller, callee): what it is, and whether a real NIC keeps it
KINDS = [
    ("ibv_get_cq_event", "read", "completion event: the channel's fd read", "stays on a NIC"),
    ("aeApiPoll", "epoll_wait", "the event loop's wait", "stays on a NIC"),
    ("execute_ioctl", "ioctl", "CQ armed again (rxe: a verbs command)", "user space on mlx5"),
    ("0x", "write", "rxe's send doorbell", "user space on a NIC"),
    ("getMonotonicUs", "clock_gettime", "the server's clock", "vDSO natively, a system call under valgrind"),
    ("ustime", "gettimeofday", "the server's clock", "vDSO natively, a system call under valgrind"),
]


def calls(path):
    """(requests, {(caller, callee): system calls under that call})"""
    requests = Requests()
    by_caller = defaultdict(int)

    def count_syscalls(caller, callee, n):
        by_caller[(caller, callee)] += n

    for _ in walk(path, requests, event="sysCount", on_call_cost=count_syscalls):
        pass
    return requests.n, by_caller


for path in sys.argv[1:]:
    requests, by_caller = calls(path)
    print(f"{path}: {requests} requests; system calls per request, by caller:")
    for what_caller, what_callee, meaning, nic in KINDS:
        n = sum(v for (caller, callee), v in by_caller.items() if caller.startswith(what_caller) and what_callee in callee)
        print(f"  {n / max(requests, 1):6.3f}  {meaning} ({what_caller} -> {what_callee}): {nic}")
