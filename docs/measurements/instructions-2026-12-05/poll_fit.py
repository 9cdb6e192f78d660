#!/usr/bin/env python3
"""poll_fit.py BASE_DUMP... -- DUMP... - the shared poll's own cost, with the wake-up's share taken out.

A shared poll's self cost is a part per poll (the channel, the table holds, the scratch) and a
part per request it routes; how many requests a poll serves moves from run to run with the
guest's speed, and with it the per-request count. The base dumps (several runs of one build)
fit cost-per-poll = a + b * requests-per-poll; each other dump is reported as its residual
against that line, per poll and per request. Dumps as kept by tests/e2e/instructions.sh
(INSTR_KEEP=1)."""
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../tests/e2e"))
from callgrind_split import group_of, walk  # noqa: E402

POLL = "rdma::transport::shared_cqs::poll"


def point(path):
    calls, own = defaultdict(int), 0

    def on_call(callee, count):
        calls[callee] += count

    for ob, fn, _, ir in walk(path, on_call):
        if group_of(ob) == "module" and fn == POLL:
            own += ir
    return calls["processCommand"] / calls[POLL], own / calls[POLL]


def main():
    args = sys.argv[1:]
    split = args.index("--")
    base = [point(p) for p in args[:split]]
    n = len(base)
    mx, my = sum(x for x, _ in base) / n, sum(y for _, y in base) / n
    b = sum((x - mx) * (y - my) for x, y in base) / sum((x - mx) ** 2 for x, _ in base)
    a = my - b * mx
    print(f"base: {a:.0f} per poll + {b:.0f} per request routed")
    for p in args[:split] + args[split + 1:]:
        x, y = point(p)
        r = y - a - b * x
        print(f"{p}: {x:.2f} requests per poll, {y:.0f} per poll, residual {r:+.0f} per poll, {r / x:+.1f} per request")


if __name__ == "__main__":
    main()
