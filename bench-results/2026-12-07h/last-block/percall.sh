#!/bin/bash
# percall.sh NET T N : per-task sums (ms) for old/new binaries, medians over N alternated runs
NET=$1; T=$2; N=$3; W=target/e2e-bench/work-$NET
for i in $(seq 1 $N); do for v in old new; do
  ${BINS:?BINS: the directory holding old-NET and new-NET}/$v-$NET $W/input.bin ${TMPDIR:-/tmp}/o.bin $T | awk -v v=$v -v i=$i '/^CALL/{split($3,a,":"); s[a[1]]+=$2} END {for (k in s) print v, i, k, s[k]*1e3}'
done; done > ${TMPDIR:-/tmp}/percall-$NET.txt
python3 - "$NET" <<'PY'
import os,sys,collections,statistics
d=collections.defaultdict(lambda: collections.defaultdict(list))
for l in open(f"{os.environ.get('TMPDIR', '/tmp')}/percall-{sys.argv[1]}.txt"):
    v,i,k,t=l.split(); d[k][v].append(float(t))
rows=[]
for k in d:
    o=statistics.median(d[k]["old"]); n=statistics.median(d[k]["new"])
    rows.append((o-n,k,o,n))
rows.sort()
for r in rows:
    if abs(r[0])>0.005*max(r[2],0.01) : print("%-8s old %.3f new %.3f ratio %.3f"%(r[1],r[2],r[3],r[2]/r[3]))
PY
