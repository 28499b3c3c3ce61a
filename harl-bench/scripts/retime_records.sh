#!/bin/bash
# Times each shipped record of one network against this build's default schedule of the same
# task, in one worker (`harl-bench probe --against`), on this machine:
#
#   retime_records.sh NET CLASS THREADS OUT      e.g. mobilenetv2 x86_64-avx2 2 out/retime
#
# NET names tuning-cache/networks/NET.json; CLASS the record file. Writes OUT/<kernel>.log
# (probe's table) and prints one line per task: default and record median latencies (the
# default's: the median of its two runs) and the record's speed over the default's. KERNELS="net_t3 net_t6" limits
# it to those tasks; PROBE_TIMEOUT (seconds, default 300) bounds each probe.
set -eu
NET=$1 CLASS=$2 THREADS=$3 OUT=$4
B=${HARL_BENCH:-target/release/harl-bench}
TASKS=tuning-cache/networks/$NET.json
mkdir -p "$OUT"
python3 - "$TASKS" "tuning-cache/$CLASS.jsonl" "$OUT" <<'PY'
import json, sys
tasks, records, out = sys.argv[1:4]
keys = {t["workload_key"]: t["kernel"] for t in json.load(open(tasks))}
for line in open(records):
    r = json.loads(line)
    k = keys.get(r["workload_key"])
    if k:
        json.dump(r["schedule"], open(f"{out}/{k}.record.json", "w"))
PY
for f in "$OUT"/*.record.json; do
  k=$(basename "$f" .record.json)
  if [ -n "${KERNELS:-}" ] && [[ " $KERNELS " != *" $k "* ]]; then continue; fi
  timeout "${PROBE_TIMEOUT:-300}" "$B" probe --workload "$TASKS@$k" --against "$f" --threads "$THREADS" --rounds 5 > "$OUT/$k.log" 2>&1 || { echo "$k: probe failed"; continue; }
  python3 - "$OUT/$k.log" "$k" <<'PY'
import sys, statistics
rows = {}
for l in open(sys.argv[1]):
    c = [x.strip() for x in l.split("|")]
    if len(c) > 7 and (c[1] in ("default", "default (again)") or c[1].endswith(".record")):
        rows[c[1]] = float(c[6])
d = statistics.median([rows.get("default", 0), rows.get("default (again)", 0)])
r = next((v for n, v in rows.items() if n.endswith(".record")), 0)
print(f"{sys.argv[2]:10s} default {d:9.1f} us  record {r:9.1f} us  record speed / default {d / r if r else 0:5.2f}")
PY
done
