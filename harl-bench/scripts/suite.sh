#!/usr/bin/env bash
# Tunes suite workloads one after another with `harl-bench tune` and prints a summary table.
#
#   harl-bench/scripts/suite.sh STRATEGY TRIALS THREADS OUT [BATCH] [WORKLOADS...]
#
# Run from the workspace root. Without WORKLOADS, the whole suite (`harl-bench list`), cheapest
# first. Each workload writes OUT/<name>/{summary.json,curve.csv,records.json}.
set -euo pipefail
strategy=${1:?strategy}
trials=${2:?trials}
threads=${3:?threads}
out=${4:?out dir}
batch=${5:-64}
shift $(( $# < 5 ? $# : 5 ))
cargo build --release -p harl-bench
bin=target/release/harl-bench
if [ $# -gt 0 ]; then
  workloads=("$@")
else
  workloads=(gemm_128 batch_gemm gemm_512 gemm_128x768x3072 conv1d gemm_1024 depthwise_112
             conv2d_transpose conv2d_224 conv2d_56 conv3d)
fi
for w in "${workloads[@]}"; do
  "$bin" tune --workload "$w" --strategy "$strategy" --trials "$trials" --seed 0 \
    --threads "$threads" --batch "$batch" --out "$out/$w"
done
"$bin" summarize "$out"
