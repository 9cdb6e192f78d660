import sys
def load(f):
    return [tuple(int(x) for x in l.split('\t')) for l in open(f).read().split('\n')[1:] if l]
for f in sys.argv[1:]:
    r=load(f); byc={}
    for x in r: byc.setdefault(x[0],[]).append(x[2])
    print(f"{f.split('/')[-1]:22}", " ".join(f"{len(v)}/{sum(v)//len(v)}" for c,v in sorted(byc.items())))
