#!/usr/bin/env python3
"""Makes the small ONNX models of harl-te's import tests, and their reference outputs.

    python3 harl-te/tests/onnx/make_models.py [OUT_DIR]   (default: this script's directory)

For each model NAME it writes NAME.onnx (random weights from a fixed seed, as initializers),
NAME.in.bin (the input) and NAME.out.bin (onnxruntime's output on it), raw little-endian f32.
The models use the ops of ResNet-50, MobileNet-V2 and BERT-base exports at small sizes; the
tests import each, run harl's reference interpreter over its tasks and compare with
onnxruntime's output. Needs numpy, onnx and onnxruntime (pip).
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
RNG = np.random.default_rng(7)


def w(*shape, scale=None):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    s = scale if scale is not None else 1.0 / np.sqrt(fan_in)
    return (RNG.uniform(-1.0, 1.0, size=shape) * s).astype(np.float32)


class Model:
    def __init__(self):
        self.nodes, self.inits, self.n = [], [], 0

    def init(self, arr):
        self.n += 1
        name = f"w{self.n}"
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def op(self, op_type, inputs, **attrs):
        self.n += 1
        out = f"t{self.n}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"{op_type.lower()}_{self.n}", **attrs))
        return out

    def conv(self, x, c, f, k, stride=1, pad=None, groups=1, bias=True, pads=None):
        p = k // 2 if pad is None else pad
        ins = [x, self.init(w(f, c // groups, k, k))]
        if bias:
            ins.append(self.init(w(f, scale=0.1)))
        return self.op("Conv", ins, kernel_shape=[k, k], strides=[stride, stride],
                       pads=pads or [p, p, p, p], group=groups)

    def bn(self, x, c):
        return self.op("BatchNormalization", [x, self.init(w(c, scale=1.0) + 1.5), self.init(w(c, scale=0.2)),
                                              self.init(w(c, scale=0.1)), self.init(np.abs(w(c, scale=1.0)) + 0.5)],
                       epsilon=1e-5)

    def save(self, name, inp, shape, out_shape, out_dir):
        out = self.nodes[-1].output[0]
        graph = helper.make_graph(self.nodes, name, [helper.make_tensor_value_info(inp, TensorProto.FLOAT, shape)],
                                  [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        path = os.path.join(out_dir, f"{name}.onnx")
        onnx.save(model, path)
        x = RNG.uniform(-1.0, 1.0, size=shape).astype(np.float32)
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        y = sess.run(None, {inp: x})[0].astype(np.float32)
        x.tofile(os.path.join(out_dir, f"{name}.in.bin"))
        y.tofile(os.path.join(out_dir, f"{name}.out.bin"))
        print(f"{name}: {len(self.nodes)} nodes, output {list(y.shape)}")


def cnn(out_dir):
    """A ResNet / MobileNet-V2 shaped network: conv+BN+ReLU, max pool, an inverted residual block
    (pointwise ReLU6, depthwise stride 1 and 2, projection, residual add), a basic block with a
    1x1 stride-2 shortcut and asymmetric padding, global average pool, flatten, gemm, softmax."""
    m = Model()
    x = m.op("Relu", [m.bn(m.conv("x", 3, 8, 3, stride=2, bias=False), 8)])
    x = m.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    # Inverted residual, stride 1: expand, depthwise, project, add.
    h = m.op("Clip", [m.conv(x, 8, 24, 1), m.init(np.array(0.0, np.float32)), m.init(np.array(6.0, np.float32))])
    h = m.op("Clip", [m.conv(h, 24, 24, 3, groups=24), m.init(np.array(0.0, np.float32)),
                      m.init(np.array(6.0, np.float32))])
    x = m.op("Add", [m.conv(h, 24, 8, 1), x])
    # Depthwise stride 2 with padding only at the bottom and right (TF-style 'SAME').
    h = m.op("Relu", [m.conv(x, 8, 8, 3, stride=2, groups=8, pads=[0, 0, 1, 1])])
    s = m.conv(h, 8, 16, 1)
    # Basic block: conv-BN-ReLU, conv-BN, + shortcut, ReLU.
    b = m.op("Relu", [m.bn(m.conv(s, 16, 16, 3, bias=False), 16)])
    b = m.bn(m.conv(b, 16, 16, 3, bias=False), 16)
    x = m.op("Relu", [m.op("Add", [b, s])])
    x = m.op("AveragePool", [x], kernel_shape=[2, 2], strides=[1, 1])
    x = m.op("GlobalAveragePool", [x])
    x = m.op("Flatten", [x], axis=1)
    x = m.op("Gemm", [x, m.init(w(10, 16)), m.init(w(10, scale=0.1))], transB=1)
    m.op("Softmax", [x], axis=-1)
    m.save("cnn", "x", [1, 3, 32, 32], [1, 10], out_dir)


def encoder_layer(m, x, s, h, nh, ff, eps):
    """One BERT encoder layer on `x` ([1, s, h]), as exporters write it: projections with bias,
    heads by Reshape and Transpose, scaled scores, softmax, context, output projection with
    residual and layer norm, FFN with erf-form GELU, residual and layer norm. Returns its
    output's name. (`harl-bench/scripts/make_networks.py` stacks twelve for BERT-base.)"""
    dh = h // nh

    def dense(x, k, n):
        return m.op("Add", [m.op("MatMul", [x, m.init(w(k, n))]), m.init(w(n, scale=0.1))])

    def layer_norm(x):
        return m.op("LayerNormalization", [x, m.init(w(h, scale=0.2) + 1.0), m.init(w(h, scale=0.1))],
                    axis=-1, epsilon=eps)

    def heads(x):
        r = m.op("Reshape", [x, m.init(np.array([1, s, nh, dh], np.int64))])
        return m.op("Transpose", [r], perm=[0, 2, 1, 3])

    q, k, v = heads(dense(x, h, h)), heads(dense(x, h, h)), heads(dense(x, h, h))
    kt = m.op("Transpose", [k], perm=[0, 1, 3, 2])
    scores = m.op("Mul", [m.op("MatMul", [q, kt]), m.init(np.array(1.0 / np.sqrt(dh), np.float32))])
    ctx = m.op("MatMul", [m.op("Softmax", [scores], axis=-1), v])
    ctx = m.op("Reshape", [m.op("Transpose", [ctx], perm=[0, 2, 1, 3]), m.init(np.array([1, s, h], np.int64))])
    a = layer_norm(m.op("Add", [dense(ctx, h, h), x]))
    u = dense(a, h, ff)
    # GELU as exported before opset 20: x * 0.5 * (1 + erf(x / sqrt 2)).
    g = m.op("Mul", [m.op("Mul", [u, m.op("Add", [m.op("Erf", [m.op("Div", [u, m.init(np.array(np.sqrt(2.0), np.float32))])]),
                                                m.init(np.array(1.0, np.float32))])]),
                     m.init(np.array(0.5, np.float32))])
    return layer_norm(m.op("Add", [dense(g, ff, h), a]))


def encoder(out_dir):
    """A BERT-shaped encoder layer (sequence 8, hidden 32, 2 heads of 16, FFN 64)."""
    s, h = 8, 32
    m = Model()
    encoder_layer(m, "x", s, h, nh=2, ff=64, eps=1e-5)
    m.save("encoder", "x", [1, s, h], [1, s, h], out_dir)


def unsupported(out_dir):
    """A model with an op harl does not import (Concat): the import must name it."""
    m = Model()
    m.op("Concat", ["x", m.op("Relu", ["x"])], axis=1)
    m.save("unsupported", "x", [1, 4], [1, 8], out_dir)


def pointwise(out_dir):
    """A ResNet bottleneck's 1x1 convolutions with 64 filters (imported as matrix products over
    flattened pixels): conv+BN+ReLU, a 1x1 shortcut with bias, and conv + shortcut + ReLU."""
    m = Model()
    h = m.op("Relu", [m.bn(m.conv("x", 16, 64, 1, bias=False), 64)])
    s = m.conv("x", 16, 64, 1)
    m.op("Relu", [m.op("Add", [m.conv(h, 64, 64, 1), s])])
    m.save("pointwise", "x", [1, 16, 6, 10], [1, 64, 6, 10], out_dir)


if __name__ == "__main__":
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    cnn(out_dir)
    encoder(out_dir)
    unsupported(out_dir)
    pointwise(out_dir)
