#!/usr/bin/env python3
"""callgrind_lines.py DUMP MODULE.so [FUNCTION] - where the module's instructions go, per request.

DUMP is a callgrind dump kept by tests/e2e/instructions.sh with per-instruction counts
(INSTR_VG_ARGS=--dump-instr=yes INSTR_KEEP=1); MODULE.so the very build that ran (its debug
lines). Each instruction's address is mapped to its source, through the inlining
(addr2line -i), and its count charged to the innermost line of our own code (src/...);
divided by the commands the server ran in the dump (its calls of processCommand).

Prints the module's instructions per request by file (std's Mutex lock and unlock counted
apart) and, with FUNCTION (a substring of a function's name), by line of that function.
"""
import re
import subprocess
import sys
from collections import defaultdict


def costs(path, want=""):
    """(requests, {address: Ir}) of the module's instructions in functions matching `want`."""
    names = {"ob": {}, "fn": {}}

    def name(kind, value):  # "(12) name" defines id 12, "(12)" refers to it
        m = re.match(r"\((\d+)\)(?:\s+(.*))?$", value)
        if not m:
            return value
        table = names[kind]
        if m.group(2) is not None:
            table[m.group(1)] = m.group(2)
        return table.get(m.group(1), "?")

    ob = fn = cfn = ""
    skip = False
    last = 0
    requests = 0
    by_addr = defaultdict(int)
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            if line[0].isdigit() or line[0] in "+-*":
                parts = line.split()
                p = parts[0]  # the address, absolute or relative to the last
                pos = last if p == "*" else last + int(p, 0) if p[0] in "+-" else int(p, 0)
                last = pos
                if skip:  # the inclusive cost of a call: counted in the callee
                    skip = False
                elif len(parts) > 2 and "librdma" in ob and want in fn:
                    by_addr[pos] += int(parts[-1])
                continue
            key, _, value = line.partition("=")
            if key == "ob":
                ob = name("ob", value)
            elif key == "fn":
                fn = name("fn", value)
            elif key == "cob":
                name("ob", value)
            elif key == "cfn":
                cfn = name("fn", value)
            elif key == "calls":
                skip = True
                if cfn == "processCommand":
                    requests += int(value.split()[0])
    return requests, by_addr


def sources(so, addrs):
    """{address: [(function, file:line), ...]} innermost first."""
    out = subprocess.run(["addr2line", "-a", "-i", "-f", "-C", "-e", so] + [hex(a) for a in addrs],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    chains, cur, i = {}, None, 0
    while i < len(out):
        if out[i].startswith("0x"):
            cur = int(out[i], 16)
            chains[cur] = []
            i += 1
        else:
            chains[cur].append((out[i], out[i + 1] if i + 1 < len(out) else ""))
            i += 2
    return chains


NOT_OURS = re.compile(r"/rustc/|/library/|/\.cargo/|/rust/deps/|^\?\?")


def ours(chain):
    """The innermost file:line of our own code (src/...), or None."""
    for _, loc in chain:
        m = re.search(r"/(src/\S+:[\d?]+)", loc)
        if m and not NOT_OURS.search(loc):
            return m.group(1)
    return None


def main():
    path, so = sys.argv[1], sys.argv[2]
    want = sys.argv[3] if len(sys.argv) > 3 else ""
    requests, by_addr = costs(path, want)
    if not requests or not by_addr:
        sys.exit("no requests or no module instructions in the dump (kept with --dump-instr=yes?)")
    chains = sources(so, sorted(by_addr))
    by_key = defaultdict(int)
    for addr, ir in by_addr.items():
        chain = chains.get(addr, [])
        files = " ".join(loc for _, loc in chain)
        line = ours(chain)
        if re.search(r"sync/mutex|sync/poison|panicking\.rs|mutex/futex", files):
            key = "std Mutex lock and unlock"
        elif want:
            key = line or "(std) " + (chain[0][1] if chain else "?")
        else:
            key = line.split(":")[0] if line else "(std) " + (chain[0][1].split("/library/")[-1].split(":")[0] if chain else "?")
        by_key[key] += ir
    print(f"{requests} requests, {sum(by_addr.values()) / requests:.0f} instructions each"
          + (f" in functions matching {want!r}" if want else ""))
    for key, ir in sorted(by_key.items(), key=lambda kv: -kv[1])[:40]:
        print(f"{ir / requests:8.1f}  {key}")


if __name__ == "__main__":
    main()
