#!/usr/bin/env python3
"""onnxruntime's time per node of a network, to set beside `harl-bench e2e`'s per-call times.

    ort_profile.py MODEL.onnx THREADS [RUNS]

Runs the model RUNS times (default 50) with onnxruntime's profiler on (`intra_op_num_threads =
THREADS`, sequential execution, all graph optimizations, as `ort_e2e.py`) and prints each
node's median kernel time in microseconds, in execution order, then their sum. The profile
file goes to the system's temporary directory.
"""
import collections
import json
import sys
import tempfile

import numpy as np
import onnxruntime as ort


def main():
    model, threads = sys.argv[1], int(sys.argv[2])
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 50
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.enable_profiling = True
    so.profile_file_prefix = tempfile.gettempdir() + "/ort-profile"
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    meta = sess.get_inputs()[0]
    x = np.random.default_rng(7).random(meta.shape, dtype=np.float32)
    for _ in range(runs):
        sess.run(None, {meta.name: x})
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    times = collections.defaultdict(list)
    ops = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            node = e["name"][: -len("_kernel_time")]
            times[node].append(e["dur"])
            ops[node] = e["args"].get("op_name", "?")
    total = 0
    for node, durs in times.items():
        durs.sort()
        median = durs[len(durs) // 2]
        total += median
        print(f"{median:8d} us  {ops[node]:20s} {node}")
    print(f"{total:8d} us  total")


if __name__ == "__main__":
    main()
