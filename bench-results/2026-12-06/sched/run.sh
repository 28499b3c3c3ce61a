#!/bin/bash
# HARL (task bandit + HARL search) at 0.7x the budget against Ansor (gradient + evolutionary) at 1x, 3 seeds, MobileNet-V2
cd .
for seed in 0 1 2; do
  for cfg in "gradient ansor 300" "harl harl 210"; do
    set -- $cfg
    out=out/sched-$1-s$seed
    start=$(date +%s)
    target/release/harl-bench e2e --model out/nets/mobilenetv2.onnx --threads 1,2 --rounds 3 --trials 100000 --seconds $3 --scheduler $1 --strategy $2 --seed $seed --out $out > $out.log 2>&1
    echo "$1 seed $seed budget $3 s: wall $(( $(date +%s) - start )) s: $(tail -2 $out.log | tr '\n' ' ')"
  done
done
