#!/usr/bin/env python3
"""callgrind_split.py DUMP - a callgrind dump of valkey-server, split by object.

Prints one JSON object: the requests in the dump (calls of processCommand, one per
command the server ran), the instructions (Ir) each group of objects spent (self cost,
not inclusive: every instruction counts once), and the top functions of the RDMA module
(8, or SPLIT_TOP). Used by tests/e2e/instructions.sh.
"""
import json
import os
import re
import sys
from collections import defaultdict

GROUPS = [  # (group, pattern on the object's file name), first match wins
    ("module", re.compile(r"(librdma|valkey-rdma|rdma)\.so$")),
    ("rdma-core", re.compile(r"(libibverbs|librdmacm|-rdmav\d+)\.so")),
    ("libc", re.compile(r"/libc\.so")),
    ("valkey-server", re.compile(r"valkey-server$")),
]


def group_of(obj):
    for name, pattern in GROUPS:
        if pattern.search(obj):
            return name
    return "other"


def split(path):
    names = {"ob": {}, "fn": {}}
    ob = fn = cfn = ""
    skip_next_cost = False
    by_group = defaultdict(int)
    module_fns = defaultdict(int)
    requests = 0

    def name(kind, value):
        # "(12) name" defines id 12, "(12)" refers to it, a plain name has no id
        m = re.match(r"\((\d+)\)(?:\s+(.*))?$", value)
        if not m:
            return value
        table = names["ob" if kind in ("ob", "cob") else "fn"]
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
                if skip_next_cost:  # the inclusive cost of a call: counted in the callee
                    skip_next_cost = False
                    continue
                parts = line.split()
                if len(parts) > 1:
                    ir = int(parts[-1])  # (the last column: also with --dump-instr=yes)
                    by_group[group_of(ob)] += ir
                    if group_of(ob) == "module":
                        module_fns[fn] += ir
                continue
            key, _, value = line.partition("=")
            if key == "ob":
                ob = name("ob", value)
            elif key == "fn":
                fn = name("fn", value)
            elif key == "cob":
                name("cob", value)
            elif key == "cfn":
                cfn = name("cfn", value)
            elif key == "calls":
                skip_next_cost = True
                if cfn == "processCommand":
                    requests += int(value.split()[0])
    top = sorted(module_fns.items(), key=lambda kv: -kv[1])[: int(os.environ.get("SPLIT_TOP", "8"))]
    return {"requests": requests, "ir": dict(by_group), "module_top": top}


if __name__ == "__main__":
    print(json.dumps(split(sys.argv[1])))
