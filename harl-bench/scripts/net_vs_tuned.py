#!/usr/bin/env python3
"""Each task's time in the network against the time the tuner recorded for its schedule.

Usage: net_vs_tuned.py DIR [THREADS]

DIR is an `harl-bench e2e --trials N --out DIR` directory: its `tune-results.json` holds the
latency the tuner re-timed for each task's record (the kernel alone, in a loop, warm, at the
threads the tune used), its `e2e.json` the median time of every call in the built network.
Prints, per task, the ratio network / tuner, and the sums over the network's calls.
"""
import collections
import json
import statistics
import sys


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    out = sys.argv[1]
    threads = int(sys.argv[2]) if len(sys.argv) == 3 else 2
    tuned = {t["name"]: t for t in json.load(open(f"{out}/tune-results.json"))}
    e2e = json.load(open(f"{out}/e2e.json"))
    rows = [r for r in e2e["rows"] if r["threads"] == threads]
    if not rows:
        sys.exit(f"{out}/e2e.json has no run at {threads} threads")
    calls = collections.defaultdict(list)
    for c in rows[0]["calls"]:
        calls[c["call"].split(":")[0]].append(c["harl_s"])
    table = []
    for task, times in calls.items():
        alone = tuned[task]["latency_s"]
        table.append((statistics.median(times) / alone, task, alone, statistics.median(times), len(times)))
    table.sort()
    print(f"{'task':<10}{'tuner ms':>10}{'network ms':>12}{'ratio':>8}{'calls':>7}")
    for ratio, task, alone, net, n in table:
        print(f"{task:<10}{alone * 1e3:>10.3f}{net * 1e3:>12.3f}{ratio:>7.2f}x{n:>7}")
    net_sum = sum(sum(t) for t in calls.values())
    alone_sum = sum(tuned[k]["latency_s"] * len(t) for k, t in calls.items())
    ratios = [r[0] for r in table]
    print(
        f"calls' sum {net_sum * 1e3:.2f} ms against the tuner's {alone_sum * 1e3:.2f} ms "
        f"({net_sum / alone_sum:.2f}x; per task {min(ratios):.2f}-{max(ratios):.2f}x, "
        f"median {statistics.median(ratios):.2f}x); network {rows[0]['harl_s'] * 1e3:.2f} ms, "
        f"onnxruntime {rows[0]['ort_s'] * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    main()
