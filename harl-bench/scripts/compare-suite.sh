#!/usr/bin/env bash
# HARL against the Ansor-style baseline on suite workloads, one `harl-bench compare` each.
#
#   harl-bench/scripts/compare-suite.sh TRIALS OUT [WORKLOADS...]
#
# Run from the workspace root. Each workload writes OUT/<name>/{compare.json,curves.csv,
# curves.svg,runs/}; finished (strategy, seed) runs are kept in runs/ and reused, so the script
# can be stopped and started again, or run as several processes over different workloads.
# STRATEGIES (default harl,ansor), SEEDS (0,1,2), BATCH (64) and THREADS (1) come from the
# environment. Ends with the table of `harl-bench compare-summary OUT`.
set -euo pipefail
trials=${1:?trials}
out=${2:?out dir}
shift 2
cargo build --release -p harl-bench
bin=target/release/harl-bench
if [ $# -gt 0 ]; then
  workloads=("$@")
else
  workloads=(gemm_128 batch_gemm gemm_512 gemm_128x768x3072 conv1d gemm_1024 depthwise_112
             conv2d_transpose conv2d_224 conv2d_56 conv3d)
fi
for w in "${workloads[@]}"; do
  "$bin" compare --workload "$w" --strategies "${STRATEGIES:-harl,ansor}" --trials "$trials" \
    --seeds "${SEEDS:-0,1,2}" --batch "${BATCH:-64}" --threads "${THREADS:-1}" --out "$out/$w"
done
"$bin" compare-summary "$out"
