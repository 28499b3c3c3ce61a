#!/usr/bin/env python3
"""Marks the shipped records whose tune the default schedule won (`default_won`).

A tune records the fastest of the default and its finalists, re-timed side by side; when the
default is fastest, the record's latency is exactly the default's re-timed median, which the
tune's `tune-results.json` lists per kernel as `default_latency_s`. A record matches a
tune-results entry by workload key, ISA class, CPU model and latency. Usage, from the repo root:

    python3 bench-results/2026-12-07h/mark_default_won.py tuning-cache/x86_64-avx512.jsonl \
        ISA_CLASS CPU_MODEL tune-results.json...

Prints how many records of each tune it marked; rewrites the cache file in place, keeping the
line order and every other field.
"""
import json
import sys


def main():
    path, isa, cpu = sys.argv[1:4]
    won = {}
    for results in sys.argv[4:]:
        for o in json.load(open(results)):
            if o.get("latency_s") is not None and o.get("latency_s") == o.get("default_latency_s"):
                won[(o["workload_key"], o["latency_s"])] = results
    lines = open(path).read().splitlines()
    out, marked = [], {}
    for line in lines:
        r = json.loads(line)
        key = (r["workload_key"], r["latency_s"])
        if r["target"]["isa_class"] == isa and r["target"]["cpu_model"] == cpu and key in won:
            marked[won[key]] = marked.get(won[key], 0) + 1
            if not r.get("default_won"):
                # The field goes last, as harl writes it; the rest of the line stays as written.
                assert line.endswith("}")
                line = line[:-1] + ',"default_won":true}'
                assert json.loads(line)["default_won"] is True
        out.append(line)
    open(path, "w").write("\n".join(out) + "\n")
    for results, n in sorted(marked.items()):
        print(f"{results}: {n} marked")


main()
