#!/bin/bash
# Issue 18's unmeasured target: a 64-trial tune with the default model (xgb-transfer) against
# cold XGBoost at 1,000 trials. Per held-out workload, seed 0, 1 thread: cold xgb 1,000 trials,
# xgb-transfer 64 and 256 trials (separate runs); then all three winners and the default
# re-timed side by side (compare-retime, 5 rounds). The xgb curve gives its 64 and 256 figures.
set -u
B=target/release/harl-bench
D=${OUT:-bench-results/2026-12-06/warm-1000}
for w in ${WORKLOADS:-conv2d_56 gemm_128x768x3072 depthwise_112 gemm_512 conv1d batch_gemm}; do
  $B compare --workload $w --strategies ansor@xgb --trials 1000 --seeds 0 --threads 1 --retime 0 --out $D/$w/xgb1000 > $D/$w-xgb1000.log 2>&1
  $B compare --workload $w --strategies ansor@xgb-transfer --trials 64 --seeds 0 --threads 1 --retime 0 --out $D/$w/xt64 > $D/$w-xt64.log 2>&1
  $B compare --workload $w --strategies ansor@xgb-transfer --trials 256 --seeds 0 --threads 1 --retime 0 --out $D/$w/xt256 > $D/$w-xt256.log 2>&1
  mkdir -p $D/$w/all/runs
  cp $D/$w/xgb1000/compare.json $D/$w/all/compare.json
  cp $D/$w/xgb1000/runs/ansor@xgb-seed0.json $D/$w/all/runs/xgb@1000-seed0.json
  cp $D/$w/xt64/runs/ansor@xgb-transfer-seed0.json $D/$w/all/runs/xgb-transfer@64-seed0.json
  cp $D/$w/xt256/runs/ansor@xgb-transfer-seed0.json $D/$w/all/runs/xgb-transfer@256-seed0.json
  $B compare-retime $D/$w/all --rounds 5 > $D/$w-retime.log 2>&1
  echo "$w done $(date +%T)" >> $D/status
done
echo ALL >> $D/status
