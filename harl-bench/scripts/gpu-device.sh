#!/usr/bin/env bash
# The GPU check for a machine with an NVIDIA GPU: tunes GEMM 1024^3 and conv2d 56x56 64->64
# (every trial checked against the interpreter, GEMM compared with cuBLAS), sweeps random GPU
# schedules of the rest of the suite (each checked against the interpreter: a correctness
# sweep of the CUDA codegen on a real device), and runs the GPU example (its PTX launched
# through cudarc, checked against the CPU kernel). Results land in ${OUT:-gpu-results}.
#
#   harl-bench/scripts/gpu-device.sh [TRIALS] [SWEEP_TRIALS]
#
# With cargo on the machine it builds harl-bench and the example; on a machine without Rust,
# build both here first and point BIN at a folder holding `harl-bench` and `gpu-example`:
#
#   cargo build --release -p harl-bench
#   LD_LIBRARY_PATH=<nvrtc lib dir> cargo build --release --manifest-path examples/gpu/Cargo.toml
#   BIN=<folder> harl-bench/scripts/gpu-device.sh 200 24
set -uo pipefail
trials=${1:-300}
sweep=${2:-24}
# Steps are skipped once this many seconds have passed (device time is scarce).
deadline=${DEADLINE:-480}
late() { [ "$SECONDS" -ge "$deadline" ] && echo "skipped $1: past ${deadline}s"; }
out=${OUT:-gpu-results}
mkdir -p "$out/runs"
nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.max.sm --format=csv || true

# cudarc looks for libnvrtc.so / libcublas.so (or .so.12 and older): link whatever version the
# machine has under those names, and put its own folders on the path (NVRTC loads its builtins
# library from there).
libs=$(mktemp -d)
for name in nvrtc cublas cublasLt; do
  f=$(find /usr/local/cuda* /opt /usr/lib/x86_64-linux-gnu -name "lib$name.so*" \
        -not -path '*stubs*' -not -name '*builtins*' -not -name '*alt*' 2>/dev/null | sort -V | tail -1)
  if [ -n "$f" ]; then
    ln -sf "$f" "$libs/lib$name.so"
    export LD_LIBRARY_PATH="$(dirname "$f"):${LD_LIBRARY_PATH:-}"
    echo "lib$name: $f"
  else
    echo "lib$name: not found"
  fi
done
export LD_LIBRARY_PATH="$libs:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}${BIN:+:$BIN/lib}"

if [ -n "${BIN:-}" ]; then
  bench=$BIN/harl-bench
  example=$BIN/gpu-example
else
  cargo build --release -p harl-bench || exit 1
  cargo build --release --manifest-path examples/gpu/Cargo.toml || exit 1
  bench=target/release/harl-bench
  example=examples/gpu/target/release/gpu-example
fi

echo "== example"
timeout 60 "$example" 2>&1 | tee "$out/example.log"

echo "== tuned"
for w in gemm_1024 conv2d_56; do
  late "$w" && continue
  timeout 180 "$bench" gpu --workload "$w" --trials "$trials" --seed 0 --out "$out/runs/$w" \
    --record "$out/cache" 2>&1 | tee "$out/runs/$w.log" | grep -v '^  trial' | tail -3
  echo "$w: $(grep -c '^  trial' "$out/runs/$w.log") failed trials"
done

echo "== random-schedule sweep (every trial checked against the interpreter)"
for w in gemm_128 gemm_128x768x3072 batch_gemm conv1d conv2d_224 depthwise_112 conv3d \
         conv2d_transpose "softmax:rows=128,cols=1000" "layer_norm:rows=128,cols=768"; do
  late "$w" && continue
  d=$(echo "$w" | tr ':=,' '___')
  timeout 60 "$bench" gpu --workload "$w" --trials "$sweep" --seed 1 --strategy random \
    --out "$out/runs/$d" 2>&1 | tee "$out/runs/$d.log" | grep -v '^  trial' | tail -1
  echo "$w: $(grep -c '^  trial' "$out/runs/$d.log") failed trials"
  grep '^  trial' "$out/runs/$d.log" | head -3
done
