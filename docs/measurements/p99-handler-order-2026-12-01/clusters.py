# Where the slowest 1 % of a latency trace fall: grouped by start time (30 ms apart),
# with the connections and how many KiB each had sent before; and the first pipeline
# of each connection.
import sys
def load(f):
    return [tuple(int(x) for x in l.split('\t')) for l in open(f).read().split('\n')[1:] if l]
for f in sys.argv[1:]:
    r = load(f)
    lat = sorted(x[2] for x in r); p99 = lat[int(len(lat) * 0.99)]
    slow = sorted((x[1] // 1000, x[2] // 1000, x[0], x[3] // 1024) for x in r if x[2] >= p99)
    print(f.split('/')[-1], "p99", p99, "us; run", max(x[1] for x in r) // 1000, "ms")
    clusters = []
    for s in slow:
        if clusters and s[0] - clusters[-1][-1][0] < 30: clusters[-1].append(s)
        else: clusters.append([s])
    for c in clusters:
        print("   at %5d ms: %3d slow, max %3d ms, connections %d, KiB sent before %s" % (
            c[0][0], len(c), max(x[1] for x in c), len(set(x[2] for x in c)), sorted(set(x[3] for x in c))[:6]))
    first = sorted(x[2] // 1000 for x in r if x[3] == 0)
    if first:  # none when every connection was warmed up before the clock
        print("   first pipeline of each connection, ms: median", first[len(first) // 2], "max", first[-1])
