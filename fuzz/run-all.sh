#!/usr/bin/env bash
# Runs every fuzz target for a fixed time, one after another, then prints a summary: total
# executions (libFuzzer's stat::number_of_executed_units, summed over restarts), the last
# coverage line, and the crash artifacts found.
#
#   fuzz/run-all.sh <seconds-per-target> [target...]
#
# A crash stops libFuzzer; the script saves the artifact (fuzz/artifacts/<target>/) and restarts
# the target for the rest of its time, so a long run is not cut short by the first crash.
# Environment: SANITIZER (default address; `none` builds faster), HARL_FUZZ_ARGS (extra
# libFuzzer flags). The growing corpus is fuzz/corpus/<target>, seeded from the committed
# corpus in harl-fuzz/regressions/<target> (which is read, never written).
set -uo pipefail

seconds=${1:?usage: fuzz/run-all.sh <seconds-per-target> [target...]}
shift
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(dsl cache_line steps onnx)
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
export RUSTC_BOOTSTRAP=1
# -O: optimised (about 10x the executions of --dev); -a: debug assertions, so that an integer
# overflow panics here as it does in a user's (unoptimised) build script.
build=(-O -a -s "${SANITIZER:-address}")
mkdir -p logs
cargo fuzz build "${build[@]}" || exit 1

declare -A execs cov crashes
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t"
  rm -f "logs/$t".*.log # this invocation's runs only
  dict=()
  [ -f "$t.dict" ] && dict=("-dict=$t.dict")
  execs[$t]=0
  cov[$t]="(none)"
  crashes[$t]=0
  deadline=$(( $(date +%s) + seconds ))
  run=0
  while :; do
    left=$(( deadline - $(date +%s) ))
    [ "$left" -le 0 ] && break
    run=$((run + 1))
    log="logs/$t.$run.log"
    start=$(date +%s)
    # shellcheck disable=SC2086
    # ONNX models are larger than the other targets' inputs (the seeds are 26-36 KB).
    max_len=4096
    [ "$t" = onnx ] && max_len=65536
    cargo fuzz run "${build[@]}" "$t" "corpus/$t" "../harl-fuzz/regressions/$t" -- \
      -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 -max_total_time="$left" \
      -print_final_stats=1 -artifact_prefix="artifacts/$t/" "${dict[@]}" ${HARL_FUZZ_ARGS:-} \
      >"$log" 2>&1
    rc=$?
    n=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
    execs[$t]=$(( ${execs[$t]} + ${n:-0} ))
    c=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1)
    [ -n "$c" ] && cov[$t]=$c
    [ "$rc" -eq 0 ] && break
    crashes[$t]=$(( ${crashes[$t]} + 1 ))
    echo "== $t: run $run stopped (exit $rc); see fuzz/$log" >&2
    grep -m1 -A3 "panicked at\|ERROR: libFuzzer\|ERROR: AddressSanitizer" "$log" >&2
    # A crash within seconds of starting is one in the corpus itself: restarting would only
    # repeat it. Twenty restarts is more crash classes than a run should collect at once.
    if [ $(( $(date +%s) - start )) -lt 5 ] || [ "$run" -ge 20 ]; then
      echo "== $t: giving up on this target" >&2
      break
    fi
  done
done

echo
printf '%-12s %15s %10s  %s\n' target executions crashes coverage
total=0
for t in "${targets[@]}"; do
  printf '%-12s %15s %10s  %s\n' "$t" "${execs[$t]}" "${crashes[$t]}" "${cov[$t]}"
  total=$(( total + ${execs[$t]} ))
done
printf '%-12s %15s\n' total "$total"
for t in "${targets[@]}"; do
  ls "artifacts/$t" 2>/dev/null | sed "s|^|artifact: fuzz/artifacts/$t/|"
done
