#!/usr/bin/env python3
"""callgrind_split.py DUMP - a callgrind dump of valkey-server, split by object.

Prints one JSON object: the requests in the dump (calls of processCommand, one per
command the server ran), the instructions (Ir) each group of objects spent (self cost,
not inclusive: every instruction counts once), the part of libc's that its block copies
spent ("copies"), the top functions of the RDMA module (8, or SPLIT_TOP), and the
completion events the server took (calls of `ibv_get_cq_event`, "cq_events"). Used by
tests/e2e/instructions.sh.

Why completion events: each is a kernel entry that stays on a real NIC, where doorbells
and polling are user-space stores and loads: the NIC raises an interrupt for an armed
completion queue, the kernel wakes the event loop, and `ibv_get_cq_event` reads the
completion channel's fd. Callgrind does not count the kernel's instructions, so the
events are counted instead.

Why copies apart: callgrind counts each step of a `rep movsb` as an instruction, and
glibc's memcpy takes `rep movsb` above a size threshold, so a copy costs about one
instruction per byte above it and about one per ten bytes below it. Two modules that
copy the same bytes in pieces of other sizes then differ by thousands of instructions
per request that the processor does not execute (docs/measurements/instructions-2026-12-06).
"""
import json
import os
import re
import sys
from collections import defaultdict

GROUPS = [  # (group, pattern on the object's file name), first match wins
    ("module", re.compile(r"(librdma[-\w]*|valkey-rdma|rdma)\.so$")),
    ("rdma-core", re.compile(r"(libibverbs|librdmacm|-rdmav\d+)\.so")),
    ("libc", re.compile(r"/libc\.so")),
    ("valkey-server", re.compile(r"valkey-server$")),
]


# libc's block copies (memcpy, memmove, mempcpy and their CPU-specific variants)
COPIES = re.compile(r"^_*mem(p?cpy|move)")


def group_of(obj):
    for name, pattern in GROUPS:
        if pattern.search(obj):
            return name
    return "other"


class Requests:
    """An `on_call` for `walk`: the commands the server ran (calls of processCommand), and
    the completion events it took (calls of `ibv_get_cq_event`)."""

    def __init__(self):
        self.n = 0
        self.cq_events = 0

    def __call__(self, callee, count):
        if callee == "processCommand":
            self.n += count
        elif callee == "ibv_get_cq_event":
            self.cq_events += count


def walk(path, on_call=lambda callee, count: None, event="Ir", on_call_cost=None):
    """The self costs of a callgrind dump: yields (object, function, position, cost) for
    each cost line, in order; the cost is `event`'s (instructions unless asked). The
    position is the line's first column (the instruction's address with
    --dump-instr=yes, else its source line), resolved where the dump writes it relative
    to the one before. A call's inclusive cost is not yielded (it is counted in the
    callee); `on_call(callee, count)` sees each call record instead, and
    `on_call_cost(caller, callee, cost)`, if given, its inclusive cost of `event`."""
    names = {"ob": {}, "fn": {}}
    ob = fn = cfn = ""
    in_call = False
    last = 0
    # A cost line is its positions (one column per name in `positions:`, "line" unless
    # said) and then one value per event in `events:` order, trailing zeros left out
    # (--dump-instr=yes adds a position, --collect-systime=yes adds events after Ir).
    positions, at = 1, 0

    def cost(parts):
        return int(parts[positions + at]) if len(parts) > positions + at else 0

    def name(kind, value):
        # "(12) name" defines id 12, "(12)" refers to it, a plain name has no id
        m = re.match(r"\((\d+)\)(?:\s+(.*))?$", value)
        if not m:
            return value
        table = names[kind]
        if m.group(2) is not None:
            table[m.group(1)] = m.group(2)
        return table.get(m.group(1), "?")

    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                parts = line.split()
                p = parts[0]
                last = last if p == "*" else last + int(p, 0) if p[0] in "+-" else int(p, 0)
                if in_call:
                    in_call = False
                    if on_call_cost:
                        on_call_cost(fn, cfn, cost(parts))
                elif len(parts) > positions + at:
                    yield ob, fn, last, cost(parts)
                continue
            if line.startswith("positions:"):
                positions = len(line.split()) - 1
                continue
            if line.startswith("events:"):
                at = line.split()[1:].index(event)
                continue
            key, _, value = line.partition("=")
            if key in ("ob", "cob"):
                value = name("ob", value)
                if key == "ob":
                    ob = value
            elif key in ("fn", "cfn"):
                value = name("fn", value)
                if key == "fn":
                    fn = value
                else:
                    cfn = value
            elif key == "calls":
                in_call = True
                on_call(cfn, int(value.split()[0]))


def split(path):
    by_group = defaultdict(int)
    module_fns = defaultdict(int)
    requests = Requests()
    copies = 0
    for ob, fn, _, ir in walk(path, requests):
        group = group_of(ob)
        by_group[group] += ir
        if group == "module":
            module_fns[fn] += ir
        elif group == "libc" and COPIES.match(fn):
            copies += ir
    top = sorted(module_fns.items(), key=lambda kv: -kv[1])[: int(os.environ.get("SPLIT_TOP", "8"))]
    return {"requests": requests.n, "ir": dict(by_group), "copies": copies, "module_top": top,
            "cq_events": requests.cq_events}


if __name__ == "__main__":
    print(json.dumps(split(sys.argv[1])))
