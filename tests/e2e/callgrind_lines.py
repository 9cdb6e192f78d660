#!/usr/bin/env python3
"""callgrind_lines.py DUMP MODULE.so [FUNCTION] - where the module's instructions go, per request.

DUMP is a callgrind dump kept by tests/e2e/instructions.sh with per-instruction counts
(INSTR_VG_ARGS=--dump-instr=yes INSTR_KEEP=1); MODULE.so the very build that ran (its debug
lines). Each instruction's address is mapped to its source, through the inlining
(addr2line -i), and its count charged to the innermost line of our own code (src/...);
divided by the commands the server ran in the dump (its calls of processCommand).

Prints the module's instructions per request by file (std's Mutex lock and unlock, and the
catch_unwind of the edge's guard, counted apart by the innermost frame) and, with FUNCTION (a substring of a function's name), by line of that function.
"""
import re
import subprocess
import sys
from collections import defaultdict

from callgrind_split import Requests, walk


def costs(path, want=""):
    """(requests, {address: Ir}) of the module's instructions in functions matching `want`."""
    requests = Requests()
    by_addr = defaultdict(int)
    for ob, fn, addr, ir in walk(path, requests):
        if "librdma" in ob and want in fn:
            by_addr[addr] += ir
    return requests.n, by_addr


def per_instruction(path):
    """Whether the dump has a cost per instruction (kept with --dump-instr=yes)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("positions:"):
                return "instr" in line.split()
    return False


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


def std_share(chain):
    """The std part an instruction is charged to, by the innermost frame that says whose it
    is (a frame further out names only a caller: our code inlined into the edge's `guard`
    is ours), or None: std's Mutex (its compare-and-swap, the poison flag and the panic
    count it reads, the release), or the `catch_unwind` of the edge's guard."""
    for fn, loc in chain:
        if re.search(r"sync/mutex|sync/poison|mutex/futex", loc):
            return "std Mutex lock and unlock"
        if re.search(r"panic_count|thread::panicking|core::sync::atomic", fn):
            continue  # a helper: whose it is, the frame that called it says
        if re.search(r"catch_unwind|panicking::try|__rust_try", fn):
            return "std catch_unwind (the edge's guard)"
        if ours([(fn, loc)]):
            return None
    return None


def main():
    path, so = sys.argv[1], sys.argv[2]
    want = sys.argv[3] if len(sys.argv) > 3 else ""
    if not per_instruction(path):
        sys.exit("the dump has no cost per instruction: keep it with INSTR_VG_ARGS=--dump-instr=yes")
    requests, by_addr = costs(path, want)
    if not requests or not by_addr:
        sys.exit("no requests or no module instructions in the dump (kept with --dump-instr=yes?)")
    chains = sources(so, sorted(by_addr))
    by_key = defaultdict(int)
    for addr, ir in by_addr.items():
        chain = chains.get(addr, [])
        line = ours(chain)
        std_part = std_share(chain)
        if std_part:
            key = std_part
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
