#!/usr/bin/env python3
"""Peers of `harl-bench models`: onnxruntime (the same op or fused subgraph as an ONNX model) and,
for matmuls, numpy's BLAS (OpenBLAS in the pip wheel), timed at the thread counts asked for.

    peers.py SPECS.json OUT.json [--check-dir DIR]

SPECS.json is what harl-bench writes: a list of kernels, each with `name`, `kind` and its sizes
(and `small`, the same kernel at small sizes). For each, OUT.json gets the median seconds of
onnxruntime and (matmuls) numpy per thread count. onnxruntime's figure is the faster of its
wall time and its kernels' own times (its profiler, layout changes left out): the latter is
what the op costs inside a network, where the blocked layout is kept between ops. With --check-dir, each small twin is run
through onnxruntime on inputs made here, and DIR/<name>.in<i>.bin / <name>.out.bin (raw
little-endian f32, inputs in harl's order) let harl-bench check its interpreter against it.
"""
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def inputs_of(spec, rng):
    """The kernel's inputs in harl's order, as numpy arrays."""
    k = spec["kind"]
    r = lambda *s: rng.uniform(-1.0, 1.0, size=s).astype(np.float32)
    if k == "dense":
        xs = [r(spec["m"], spec["k"]), r(spec["k"], spec["n"]) * np.float32(1.0 / np.sqrt(spec["k"]))]
        if spec["bias"]:
            xs.append(r(spec["n"]))
        if spec["residual"]:
            xs.append(r(spec["m"], spec["n"]))
        return xs
    if k == "bmm":
        return [r(spec["b"], spec["m"], spec["k"]), r(spec["b"], spec["k"], spec["n"])]
    if k == "softmax":
        return [r(spec["rows"], spec["cols"]) * np.float32(4.0)]
    if k == "layernorm":
        return [r(spec["rows"], spec["cols"]), r(spec["cols"]), r(spec["cols"])]
    if k == "conv":
        cg = spec["c"] // spec["groups"]
        xs = [
            r(1, spec["c"], spec["hw"], spec["hw"]),
            r(spec["f"], cg, spec["kernel"], spec["kernel"]) * np.float32(1.0 / np.sqrt(cg * spec["kernel"] ** 2)),
            r(spec["f"]),
        ]
        if spec["residual"]:
            o = (spec["hw"] + 2 * (spec["kernel"] // 2) - spec["kernel"]) // spec["stride"] + 1
            xs.append(r(1, spec["f"], o, o))
        return xs
    raise ValueError(f"unknown kind {k}")


def model_of(spec, xs):
    """An ONNX model computing the kernel; weights are initializers, activations inputs."""
    k = spec["kind"]
    nodes, inits, ins = [], [], []

    def inp(name, a):
        ins.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(a.shape)))
        return name

    def init(name, a):
        inits.append(numpy_helper.from_array(a, name))
        return name

    def node(op, inputs, **attrs):
        out = f"t{len(nodes)}"
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def const(v):
        return init(f"c{len(inits)}", np.array(v, dtype=np.float32))

    def act(y, a):
        if a == "relu":
            return node("Relu", [y])
        if a == "relu6":
            return node("Clip", [y, const(0.0), const(6.0)])
        if a == "gelu":  # the exact erf form, decomposed as exporters write it (opset < 20)
            e = node("Erf", [node("Mul", [y, const(1.0 / np.sqrt(2.0))])])
            return node("Mul", [node("Mul", [y, const(0.5)]), node("Add", [e, const(1.0)])])
        return y

    if k == "dense":
        y = node("MatMul", [inp("x", xs[0]), init("w", xs[1])])
        i = 2
        if spec["bias"]:
            y = node("Add", [y, init("bias", xs[i])])
            i += 1
        if spec["residual"]:
            y = node("Add", [y, inp("residual", xs[i])])
        y = act(y, spec["act"])
    elif k == "bmm":
        y = node("MatMul", [inp("a", xs[0]), inp("b", xs[1])])
    elif k == "softmax":
        y = node("Softmax", [inp("x", xs[0])], axis=-1)
    elif k == "layernorm":
        y = node("LayerNormalization", [inp("x", xs[0]), init("gamma", xs[1]), init("beta", xs[2])],
                 axis=-1, epsilon=1e-5)
    elif k == "conv":
        p = spec["kernel"] // 2
        y = node("Conv", [inp("x", xs[0]), init("w", xs[1]), init("bias", xs[2])],
                 group=spec["groups"], strides=[spec["stride"]] * 2, pads=[p, p, p, p],
                 kernel_shape=[spec["kernel"]] * 2)
        if spec["residual"]:
            y = node("Add", [y, inp("residual", xs[3])])
        y = act(y, spec["act"])
    out_shape = None
    graph = helper.make_graph(nodes, spec["name"], ins,
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model)
    return model, [i.name for i in ins]


def session(model, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


# onnxruntime's layout changes around a lone convolution (NCHW <-> its blocked NCHWc): in a
# network they happen once at each end, so the op's own kernels are what a network pays.
LAYOUT_NODES = ("ReorderInput", "ReorderOutput")


def kernel_time(model, threads, feeds, min_runs=10, min_s=0.3):
    """Median over runs of onnxruntime's kernel times for the model's nodes, layout changes
    left out (its profiler's per-node `_kernel_time` events, grouped by `model_run`)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.gettempdir(), "harl-peers-profile")
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    median_time(lambda: sess.run(None, feeds), min_runs, min_s)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    runs = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run"]
    per_run = [0.0] * len(runs)
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        if e.get("args", {}).get("op_name") in LAYOUT_NODES:
            continue
        for i, (a, b) in enumerate(runs):
            if a <= e["ts"] <= b:
                per_run[i] += e["dur"] * 1e-6
                break
    timed = per_run[3:] or per_run
    return statistics.median(timed)


def median_time(call, min_runs=10, min_s=0.3):
    for _ in range(3):
        call()
    ts, start = [], time.perf_counter()
    while len(ts) < min_runs or time.perf_counter() - start < min_s:
        t = time.perf_counter()
        call()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def feeds_of(spec, xs, names):
    # Activations are the inputs that are not initializers, in harl's order.
    by_kind = {
        "dense": ["x"] + (["residual"] if spec.get("residual") else []),
        "bmm": ["a", "b"], "softmax": ["x"], "layernorm": ["x"],
        "conv": ["x"] + (["residual"] if spec.get("residual") else []),
    }[spec["kind"]]
    positions = {"x": 0, "a": 0, "b": 1,
                 "residual": len(xs) - 1}
    feeds = {n: xs[positions[n]] for n in by_kind if n in names}
    assert all(a.dtype == np.float32 for a in xs), [a.dtype for a in xs]
    return feeds


def main():
    specs = json.load(open(sys.argv[1]))
    out_path = sys.argv[2]
    check_dir = sys.argv[sys.argv.index("--check-dir") + 1] if "--check-dir" in sys.argv else None
    threads = [int(t) for t in os.environ.get("PEER_THREADS", "1,2").split(",")]
    try:
        from threadpoolctl import threadpool_limits, threadpool_info
        blas = [i.get("internal_api") for i in threadpool_info()]
    except ImportError:
        threadpool_limits, blas = None, []
    rng = np.random.default_rng(0)
    results = {"onnxruntime": ort.__version__, "numpy": np.__version__, "blas": blas, "kernels": {}}
    for spec in specs:
        xs = inputs_of(spec, rng)
        model, names = model_of(spec, xs)
        feeds = feeds_of(spec, xs, names)
        row = {}
        for t in threads:
            sess = session(model, t)
            wall = median_time(lambda: sess.run(None, feeds))
            kernels = kernel_time(model, t, feeds)
            # The peer is the faster: a lone convolution's wall time holds layout changes a
            # network does not pay for every op (up to 3x on MobileNet's depthwise convs).
            row[f"ort_{t}"] = min(wall, kernels)
            row[f"ort_wall_{t}"] = wall
            row[f"ort_kernels_{t}"] = kernels
            if spec["kind"] in ("dense", "bmm") and threadpool_limits is not None:
                a, b = xs[0], xs[1]
                with threadpool_limits(limits=t):
                    row[f"blas_{t}"] = median_time(lambda: np.matmul(a, b))
        results["kernels"][spec["name"]] = row
        print(spec["name"], " ".join(f"{k}={v * 1e3:.3f}ms" for k, v in row.items()), flush=True)
        if check_dir:
            small = dict(spec["small"], name=spec["name"])
            sx = inputs_of(small, rng)
            smodel, snames = model_of(small, sx)
            y = session(smodel, 1).run(None, feeds_of(small, sx, snames))[0]
            for i, a in enumerate(sx):
                a.astype("<f4").tofile(os.path.join(check_dir, f"{spec['name']}.in{i}.bin"))
            y.astype("<f4").tofile(os.path.join(check_dir, f"{spec['name']}.out.bin"))
    json.dump(results, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
