#!/usr/bin/env bash
# The GPU check for a machine with an NVIDIA GPU (the `device` tool): builds harl-bench, runs
# the GPU codegen tests against the real device's NVRTC, then tunes GEMM 1024^3 and conv2d
# 56x56 64->64 with a few hundred trials each, verified against the interpreter, GEMM compared
# with cuBLAS. Results land in ${OUT:-gpu-results}/<workload>/summary.json.
#
#   harl-bench/scripts/gpu-device.sh [TRIALS]
set -euo pipefail
trials=${1:-300}
out=${OUT:-gpu-results}
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv || true
# NVRTC: the CUDA toolkit's, or a pip wheel's if one is installed.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         "$(python3 -c 'import nvidia.cuda_nvrtc, os; print(os.path.dirname(nvidia.cuda_nvrtc.__file__) + "/lib")' 2>/dev/null || true)"; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
cargo build --release -p harl-bench
mkdir -p "$out"
for w in gemm_1024 conv2d_56; do
  target/release/harl-bench gpu --workload "$w" --trials "$trials" --seed 0 --out "$out/$w" \
    2>&1 | tee "$out/$w.log"
done
# The GPU example on a real device: its default PTX launched through cudarc, checked against
# the CPU kernel.
cargo run --release --manifest-path examples/gpu/Cargo.toml 2>&1 | tee "$out/example.log"
