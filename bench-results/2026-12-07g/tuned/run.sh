#!/bin/bash
# Tunes the three networks on this machine at the build's path (HARL's task bandit, Ansor's
# search, kernels timed at 2 threads), each one job under one budget, then times each against
# onnxruntime at 1 and 2 threads. Run from the repository root.
set -u
OUT=${OUT:-bench-results/2026-12-07g/tuned}
run() {
  local net=$1 trials=$2 seconds=$3
  env -u HARL_CACHE_DIR target/release/harl-bench e2e --model out/nets/$net.onnx --trials $trials --seconds $seconds \
    --scheduler harl --strategy ansor --seed 0 --threads 1,2 --rounds 3 --out $OUT/e2e-$net-tuned > $OUT/e2e-$net-tuned.log 2>&1
}
run mobilenetv2 1024 600
run resnet50 1984 900
run bert 768 600
