#!/usr/bin/env python3
"""bench_table.py DIR: the README's table of one `./runtest-rdma --bench` run, from its files.

Reads what tests/e2e/bench.sh wrote into DIR (the --compare rows' JSON, churn-k0.txt,
idle-200.txt, idle-capacity-*.txt) and prints one Markdown table: each ratio ours/C is the
median over the rounds, with the spread of the per-round ratios in brackets (the noise).
bench.sh writes it to DIR/summary.md, so a run from a fresh clone can be set beside the
README's table line by line.
"""
import json
import os
import re
import sys

# (file name, what the row measures): the order of the README's table
COMPARE_ROWS = [
    ("set-get-c8-p1", "SET/GET 64 B, 8 connections, no pipeline"),
    ("set-get-c8-p16", "SET/GET 64 B, 8 connections, pipeline 16"),
    ("set-get-c32-p1", "SET/GET 64 B, 32 connections, no pipeline"),
    ("set-get-c32-p16", "SET/GET 64 B, 32 connections, pipeline 16"),
    ("set-get-c4-4k", "SET/GET 4 KiB, 4 connections"),
    ("set-get-c2-1m", "SET/GET 1 MB, 2 connections"),
    ("set-get-c1-8m", "SET/GET 8 MB, 1 connection"),
    ("big-replies-c4", "big replies (LRANGE 10,000 × 100 B, HGETALL 10,000), 4 connections"),
    ("aa-noise-c-vs-c", "**A/A: the C module against itself** (8 connections, no pipeline)"),
]
# (key in ratios_ours_over_c, column title)
COLUMNS = [
    ("requests/s", "req/s"),
    ("p50 latency us", "p50"),
    ("p99 latency us", "p99"),
    ("server CPU s per Mreq", "server CPU per request"),
    ("server KiB per connection", "RSS per connection"),
    ("first use us (connect+1st)", "first use (connect + first pipeline)"),
]


def cell(ratios, key):
    """'median (min-max)' of one ratio, or '' when the run has no such figure."""
    median, rounds = ratios.get(key), ratios.get(key + " per round") or []
    if median is None:
        return ""
    if len(rounds) < 2:
        return f"{median:.3f}"
    return f"{median:.3f} ({min(rounds):.3f}-{max(rounds):.3f})"


def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def capacity_cell(text):
    """'held X of N; per connection RSS R KiB, VmPin P KiB' from an idle-capacity file."""
    if text is None:
        return "not run"
    m = re.search(r"held (\d+) of (\d+) \(at most (\d+) up at once\); per connection: "
                  r"server RSS (\S+) KiB, VmPin (\S+) KiB", text)
    if not m:
        return "no result line"
    held, n, most, rss, pin = m.groups()
    out = f"{held} of {n} held"
    if held != most:
        out += f" (at most {most} at once)"
    if rss != "-":
        out += f"; per connection {rss} KiB RSS, {pin} KiB pinned"
    crash = re.search(r"crashed by signal: (\d+)", text)
    if crash:
        out += f"; server crashed (signal {crash.group(1)})"
    elif "SERVER DIED" in text:
        out += "; server died (killed: " + ("out of memory)" if "Out of memory: Killed process" in text else "see the file)")
    # one such line per client process
    answered = re.findall(r"second PING answered by (\d+) of (\d+) held", text)
    if answered and held != "0":
        out += (f"; second PING answered by {sum(int(a) for a, _ in answered)}"
                f" of {sum(int(h) for _, h in answered)}")
    return out


def main(out_dir):
    lines = ["| workload | " + " | ".join(title for _, title in COLUMNS) + " |",
             "|---" * (len(COLUMNS) + 1) + "|"]
    for name, what in COMPARE_ROWS:
        text = read(os.path.join(out_dir, name + ".json"))
        if text is None:
            continue
        ratios = json.loads(text).get("ratios_ours_over_c", {})
        lines.append(f"| {what} | " + " | ".join(cell(ratios, key) for key, _ in COLUMNS) + " |")
    blank = " |" * len(COLUMNS)  # closes the row's one filled cell, then the empty ones
    churn = read(os.path.join(out_dir, "churn-k0.txt"))
    m = churn and re.search(r"C module ([\d.]+) req/s, ours ([\d.]+) req/s, ours/C ([\d.]+) \(rounds ([\d.-]+)", churn)
    if m:
        lines.append(f"| connection churn (`valkey-benchmark -k 0`), new connections per second | "
                     f"{m.group(3)} ({m.group(4)}): {m.group(2)} against {m.group(1)}/s{blank}")
    idle = read(os.path.join(out_dir, "idle-200.txt")) or ""
    figures = {what: f"{ratio} ({ours} vs {c} KiB)" for what, c, ours, ratio in re.findall(
        r"idle-200 (VmPin|RSS) per connection: C module ([\d.]+) KiB, ours ([\d.]+) KiB, ours/C ([\d.]+)", idle)}
    if figures:
        lines.append("| 200 idle connections, per connection |" + " |" * 4 +
                     f" VmPin {figures.get('VmPin', '?')}, RSS {figures.get('RSS', '?')} | |")
    capacity = {tag: read(os.path.join(out_dir, f"idle-capacity-{tag}.txt"))
                for tag in ("ours", "ours-default-maps", "c")}
    if any(capacity.values()):
        lines.append("| 10,000 idle connections, each PINGed twice | "
                     f"ours: {capacity_cell(capacity['ours'])}. At the default `vm.max_map_count`: "
                     f"{capacity_cell(capacity['ours-default-maps'])}. "
                     f"C module: {capacity_cell(capacity['c'])}{blank}")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: bench_table.py DIR (the folder bench.sh wrote)")
    main(sys.argv[1])
