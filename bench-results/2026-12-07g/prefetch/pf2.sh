#!/bin/bash
# usage: pf2.sh WORKLOAD THREADS "bytes:hint ..." [extra probe args]
W=$1; T=$2; S=$3; shift 3
for r in 1 2; do
  for bh in $S; do
    b=${bh%%:*}; h=${bh##*:}
    v=$(HARL_PREFETCH_BYTES=$b HARL_PREFETCH_HINT=$h target/release/harl-bench probe --workload $W --threads $T --rounds 5 "$@" 2>&1 | grep "^| default |" | awk -F'|' '{print $3, $7}')
    echo "r$r $bh $v"
  done
done
