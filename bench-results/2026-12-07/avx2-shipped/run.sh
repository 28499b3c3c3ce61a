#!/bin/bash
# The shipped AVX2 records (tuned on an AVX-512 Xeon with HARL_ISA=avx2) against the default
# schedules, on a real AVX2 CPU: each network built both ways, alternating, ROUNDS times; every
# e2e run times onnxruntime beside harl.
set -u
B=target/release/harl-bench
D=${OUT:-bench-results/2026-12-07/avx2-shipped}
mkdir -p "$D"
for r in $(seq 1 ${ROUNDS:-2}); do
  for net in ${NETS:-mobilenetv2 resnet50}; do
    env -u HARL_CACHE_DIR $B e2e --model out/nets/$net.onnx --threads 1,2 --rounds 3 --out $D/$net-default-$r > $D/$net-default-$r.log 2>&1
    echo "$net default $r $(date +%T)" >> $D/status
    HARL_CACHE_DIR=$PWD/tuning-cache $B e2e --model out/nets/$net.onnx --threads 1,2 --rounds 3 --out $D/$net-shipped-$r > $D/$net-shipped-$r.log 2>&1
    echo "$net shipped $r $(date +%T)" >> $D/status
  done
done
echo ALL >> $D/status
