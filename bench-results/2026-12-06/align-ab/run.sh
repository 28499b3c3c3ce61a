#!/bin/bash
# alternated A/B: old (before alignment) vs new, per network, 2 rounds
for r in 1 2; do for net in bert resnet50 mobilenetv2; do
  for side in old new; do
    if [ $side = old ]; then B=../old; else B=.; fi
    (cd $B && HARL_CACHE_DIR=tuning-cache $B/target/release/harl-bench e2e --model out/nets/$net.onnx --threads 1,2 --rounds 3 --out out/$side-$net-r$r > out/$side-$net-r$r.log 2>&1)
    echo "$side $net r$r: $(tail -2 out/$side-$net-r$r.log | tr '\n' ' ')"
  done
done; done
