#!/bin/bash
# every tune's records built and run again, gradient and harl alternated, one sitting
cd .
for seed in 0 1 2; do for s in gradient harl; do
  d=out/sched-$s-s$seed
  HARL_CACHE_DIR=$d/tuning-cache target/release/harl-bench e2e --model out/nets/mobilenetv2.onnx --threads 1,2 --rounds 3 --out out/retime-$s-s$seed > out/retime-$s-s$seed.log 2>&1
  echo "$s seed $seed: $(tail -2 out/retime-$s-s$seed.log | tr '\n' ' ')"
done; done
