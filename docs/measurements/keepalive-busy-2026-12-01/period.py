# For each latency trace: p99; the share of the slowest 1 % that fall in the busiest 300 ms
# phase bin of a 3000 ms period (the keepalive tick's), and the same for a 2900 ms period (control)
import sys
def load(f):
    return [tuple(int(x) for x in l.split('\t')) for l in open(f).read().split('\n')[1:] if l]
for f in sys.argv[1:]:
    r = load(f)
    lat = sorted(x[2] for x in r); p99 = lat[int(len(lat) * 0.99)]; p95 = lat[int(len(lat) * 0.95)]
    slow = [x for x in r if x[2] >= p99]
    def share(period):
        bins = [0] * 10
        for x in slow:
            # the request's end (start + latency): a stall delays the replies in flight at that moment
            bins[((x[1] + x[2]) // 1000 % period) * 10 // period] += 1
        return max(bins) / len(slow)
    print(f"{f.split('/')[-1]:16} p50 {lat[len(lat)//2]//1000:3d} ms p95 {p95//1000:3d} p99 {p99//1000:3d} ms; slow in one 10% phase bin: period 3000 ms {share(3000):.2f}, 2900 ms {share(2900):.2f}, 3100 ms {share(3100):.2f}")
