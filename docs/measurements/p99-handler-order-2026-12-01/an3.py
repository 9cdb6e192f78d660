import sys
def load(f):
    return [tuple(int(x) for x in l.split('\t')) for l in open(f).read().split('\n')[1:] if l]
for f in sys.argv[1:]:
    r=load(f)
    ends=sorted((x[1]+x[2], x[0], x[1], x[2]) for x in r)
    # group ends within 150us gaps
    groups=[]; cur=[ends[0]]
    for e in ends[1:]:
        if e[0]-cur[-1][0] < 120: cur.append(e)
        else: groups.append(cur); cur=[e]
    groups.append(cur)
    from collections import Counter
    c=Counter(len(g) for g in groups)
    print(f.split('/')[-1], "reply-arrival bursts (size:count)", sorted(c.items()))
    mid=[e for e in ends if 3000000<e[0]<3012000]
    print("  ", [(e[0]-3000000, e[1], e[3]) for e in mid])
