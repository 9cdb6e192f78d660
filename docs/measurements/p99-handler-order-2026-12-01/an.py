import sys, statistics as st
def load(f):
    rows=[]
    for l in open(f).read().split('\n')[1:]:
        if l: rows.append(tuple(int(x) for x in l.split('\t')))
    return rows
for f in sys.argv[1:]:
    r=load(f)
    lat=sorted(x[2] for x in r)
    p99=lat[int(len(lat)*0.99)]
    p50=lat[len(lat)//2]
    slow=[x for x in r if x[2]>=p99]
    T=max(x[1] for x in r)
    # time distribution: deciles of run
    dec=[0]*10
    for x in slow: dec[min(9,int(x[1]*10/T))]+=1
    # per-connection index of pipeline
    byc={}
    for x in r: byc.setdefault(x[0],[]).append(x)
    idx=[]
    for c,xs in byc.items():
        for k,x in enumerate(xs):
            if x[2]>=p99: idx.append(k)
    first=sum(1 for k in idx if k<20)
    print(f"{f.split('/')[-1]:22} n={len(r)} p50={p50} p99={p99} max={lat[-1]} slow={len(slow)} by decile={dec} in first 20 pipelines of a conn={first}")
print()
for f in sys.argv[1:]:
    r=load(f)
    lat=sorted(x[2] for x in r); p99=lat[int(len(lat)*0.99)]
    byc={}
    for x in r: byc.setdefault(x[0],[]).append(x)
    out=[]
    for W in (64<<10, 256<<10, 1<<20):
        for which in (3,4):
            cross=[];nc=[]
            for c,xs in byc.items():
                for k in range(len(xs)-1):
                    a=xs[k][which]; b=xs[k+1][which]
                    (cross if a//W != b//W else nc).append(xs[k][2])
            cs=sum(1 for v in cross if v>=p99); 
            out.append(f"{'tx' if which==3 else 'rx'}{W>>10}K: {cs}/{len(cross)}")
    # histogram buckets in ms
    h={}
    for v in lat: h[min(v//1000,30)]=h.get(min(v//1000,30),0)+1
    print(f"{f.split('/')[-1]:22}", "  ".join(out))
    print("   hist ms:", " ".join(f"{k}:{h[k]}" for k in sorted(h)))
