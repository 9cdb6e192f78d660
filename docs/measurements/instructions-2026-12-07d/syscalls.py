#!/usr/bin/env python3
"""syscalls.py DUMP... - system calls per request of valkey-server, by the function that
made the call, from callgrind dumps taken with --collect-systime=yes (instructions.sh:
INSTR_VG_ARGS=--collect-systime=yes INSTR_KEEP=1).

Each call record's inclusive sysCount is what its callee did in the kernel on behalf of
that caller; the callers of libc's system-call wrappers are listed with what each call
means for a real NIC. Requests: calls of processCommand, as in callgrind_split.py.
"""
import re
import sys
from collections import defaultdict

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
    names = {"ob": {}, "fn": {}}

    def name(kind, value):
        m = re.match(r"\((\d+)\)(?:\s+(.*))?$", value)
        if not m:
            return value
        if m.group(2) is not None:
            names[kind][m.group(1)] = m.group(2)
        return names[kind].get(m.group(1), "?")

    fn = cfn = ""
    events, positions, in_call, requests = [], 1, False, 0
    by_caller = defaultdict(int)
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            if line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith("positions:"):
                positions = len(line.split()) - 1
            elif line[0].isdigit() or line[0] in "+-*":
                if in_call:
                    in_call = False
                    values = dict(zip(events, map(int, line.split()[positions:])))
                    if values.get("sysCount"):
                        by_caller[(fn, cfn)] += values["sysCount"]
            else:
                key, _, value = line.partition("=")
                if key == "fn":
                    fn = name("fn", value)
                elif key == "cfn":
                    cfn = name("fn", value)
                elif key == "calls":
                    in_call = True
                    if cfn == "processCommand":
                        requests += int(value.split()[0])
    return requests, by_caller


for path in sys.argv[1:]:
    requests, by_caller = calls(path)
    print(f"{path}: {requests} requests; system calls per request, by caller:")
    for what_caller, what_callee, meaning, nic in KINDS:
        n = sum(v for (caller, callee), v in by_caller.items() if caller.startswith(what_caller) and what_callee in callee)
        print(f"  {n / max(requests, 1):6.3f}  {meaning} ({what_caller} -> {what_callee}): {nic}")
