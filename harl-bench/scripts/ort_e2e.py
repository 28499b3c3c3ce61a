#!/usr/bin/env python3
"""onnxruntime's side of `harl-bench e2e`: times a whole network at a thread count.

    ort_e2e.py MODEL.onnx INPUT.bin OUTPUT.bin THREADS SECONDS

Reads the input (raw little-endian f32, the model's input shape), runs the model with
`intra_op_num_threads = THREADS` (sequential execution, all graph optimizations), writes the
output to OUTPUT.bin, and prints `ORT <median seconds>` over two warm-up runs and then runs
until SECONDS and 10 runs, as harl's binary does.
"""
import sys
import time

import numpy as np
import onnxruntime as ort


def main():
    model, inp, outp, threads, seconds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    meta = sess.get_inputs()[0]
    x = np.fromfile(inp, dtype=np.float32).reshape(meta.shape)
    feed = {meta.name: x}
    y = sess.run(None, feed)[0]
    sess.run(None, feed)
    times = []
    start = time.perf_counter()
    while len(times) < 10 or time.perf_counter() - start < seconds:
        t = time.perf_counter()
        sess.run(None, feed)
        times.append(time.perf_counter() - t)
    y.astype(np.float32).tofile(outp)
    times.sort()
    print(f"ORT {times[len(times) // 2]:e}")


if __name__ == "__main__":
    main()
