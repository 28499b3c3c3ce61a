#!/usr/bin/env python3
"""Per-task time and GFLOP/s of one `harl-bench e2e` run.

usage: pertask.py TASKS.json E2E.json [THREADS]

TASKS.json is the `tasks.json` a tuning e2e run writes (the network's fused tasks); E2E.json
any e2e run of the same model. A task's FLOPs count two per multiply-add of every reducing
stage (convolutions, matmuls); element-wise tasks show no GFLOP/s.
"""
import json
import sys
from collections import defaultdict
from math import prod


def flops(task):
    total = 0
    for st in task["graph"]["stages"]:
        red = st.get("reduce")
        if red and red.get("op") == "Sum":
            total += 2 * prod(st["shape"]) * prod(red["extents"])
    return total


def main():
    tasks = {t["kernel"]: t for t in json.load(open(sys.argv[1]))}
    run = json.load(open(sys.argv[2]))
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    row = next(r for r in run["rows"] if r.get("threads") == threads)
    per = defaultdict(lambda: [0.0, 0])
    for c in row["calls"]:
        name = c["call"].split(":")[0]
        per[name][0] += c["harl_s"]
        per[name][1] += 1
    total = sum(v[0] for v in per.values())
    print(f"{'task':8} {'calls':>5} {'ms':>8} {'share':>6} {'GFLOP/s':>8}  stages")
    for name, (s, n) in sorted(per.items(), key=lambda kv: -kv[1][0]):
        t = tasks.get(name)
        f = flops(t) * n if t else 0
        g = f"{f / s / 1e9:8.1f}" if f else " " * 8
        stages = ",".join(st["name"] for st in t["graph"]["stages"]) if t else "?"
        print(f"{name:8} {n:5} {s * 1e3:8.3f} {s / total:6.1%} {g}  {stages[:60]}")
    print(f"total {total * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
