#!/bin/bash
# net.sh NET THREADS N binA binB : alternate the two network binaries N times, print HARL ms of each
NET=$1; T=$2; N=$3; A=$4; B=$5
W=target/e2e-bench/work-$NET
for i in $(seq 1 $N); do
  for bin in $A $B; do
    echo "$(basename $bin) $($bin $W/input.bin "${TMPDIR:-/tmp}/o-$(basename $bin).bin" $T | awk '/^HARL/{printf "%.3f", $2*1e3}')"
  done
done | awk '{a[$1]=a[$1]" "$2} END {for (k in a) print k, a[k]}'
