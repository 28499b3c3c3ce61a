#!/bin/bash
# pair.sh NET T N [BIN]: harl's network binary (default schedules, as `harl-bench e2e` built it)
# and onnxruntime alternated N times at T threads; prints each one's runs and the median ratio.
# From the repository root, after `harl-bench e2e --model out/nets/NET.onnx` built the binary.
NET=$1; T=$2; N=$3; BIN=${4:-target/e2e-bench/release/harl-e2e-$NET}
W=target/e2e-bench/work-$NET; TMP=${TMPDIR:-/tmp}
for i in $(seq 1 $N); do
  echo "harl $($BIN $W/input.bin $TMP/pair-h.bin $T | awk '/^HARL/{printf "%.3f", $2*1e3}')"
  echo "ort $(python3 harl-bench/scripts/ort_e2e.py out/nets/$NET.onnx $W/input.bin $TMP/pair-o.bin $T 1.0 | awk '/^ORT/{printf "%.3f", $2*1e3}')"
done | python3 -c '
import sys, statistics
runs = {}
for line in sys.stdin:
    k, v = line.split(); runs.setdefault(k, []).append(float(v))
for k, v in runs.items(): print(k, " ".join("%.3f" % x for x in v), " median %.3f" % statistics.median(v))
print("ratio %.3f" % (statistics.median(runs["harl"]) / statistics.median(runs["ort"])))'
