#!/bin/bash
# BERT-base tuned with the whole budget (20 minutes for the network; 19 here so the
# finalists' re-timing fits), the build's path (HARL's task bandit, Ansor's search, kernels
# timed at 2 threads), then timed against onnxruntime at 1 and 2 threads. From the repo root.
set -u
OUT=${OUT:-bench-results/2026-12-07h/tuned}
env -u HARL_CACHE_DIR target/release/harl-bench e2e --model out/nets/bert.onnx --trials 6000 --seconds 1140 \
  --scheduler harl --strategy ansor --seed 0 --threads 1,2 --rounds 3 --out $OUT/e2e-bert-tuned > $OUT/e2e-bert-tuned.log 2>&1
