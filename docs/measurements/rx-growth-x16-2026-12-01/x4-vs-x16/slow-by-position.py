#!/usr/bin/env python3
"""Where in each connection's byte stream the slowest 1 % of pipelines started.

Reads the --latency-trace files of ab.sh (PREFIX-ROUND-c.tsv: the x4 build, run in the
"C module" slot; PREFIX-ROUND-ours.tsv: the x16 build) from the current folder, and
counts, per 32 KiB bin of bytes the connection had sent before the pipeline, the
pipelines at or above that round's p99."""
import csv, glob

for row in ["c32-p16", "c8-p16"]:
    for who, label in [("c", "x4"), ("ours", "x16")]:
        p99s, bins = [], {}
        for f in sorted(glob.glob(f"{row}-*-{who}.tsv")):
            rs = list(csv.DictReader(open(f), delimiter="\t"))
            lat = sorted(int(r["latency_us"]) for r in rs)
            p99 = lat[int(len(lat) * 0.99)]
            p99s.append(p99)
            for r in rs:
                if int(r["latency_us"]) >= p99:
                    k = int(r["sent_before"]) // 32768 * 32
                    bins[k] = bins.get(k, 0) + 1
        top = sorted(bins.items(), key=lambda x: -x[1])[:8]
        print(f"{row} {label}: p99 per round {p99s}; slowest 1% by KiB sent before (bin: count) {top}")
