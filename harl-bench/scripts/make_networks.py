#!/usr/bin/env python3
"""Makes the networks of `harl-bench e2e` as ONNX files, by their standard definitions with
random weights (a fixed seed): ResNet-50 (v1.5: the stride on the 3x3), MobileNet-V2 (width 1.0)
and BERT-base's encoder (12 layers, hidden 768, 12 heads, FFN 3072, sequence 128; from the
hidden states on: the embedding layer needs Gather, which harl does not import yet).

    python3 harl-bench/scripts/make_networks.py OUT_DIR [resnet50 mobilenetv2 bert]

Batch norms are real BatchNormalization nodes (harl folds them); activations are Relu, Clip
(ReLU6) and erf-form GELU, as exporters write them at opset 17. Needs numpy and onnx.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../harl-te/tests/onnx"))
from make_models import Model, encoder_layer, w  # noqa: E402  (the test models' builder)


def save(m, name, shape, out_shape, out_dir):
    import onnx
    from onnx import TensorProto, helper

    out = m.nodes[-1].output[0]
    graph = helper.make_graph(m.nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)], m.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = os.path.join(out_dir, f"{name}.onnx")
    onnx.save(model, path)
    print(f"{name}: {len(m.nodes)} nodes -> {path}")


def conv_bn(m, x, c, f, k, stride=1, groups=1, act="relu"):
    y = m.bn(m.conv(x, c, f, k, stride=stride, groups=groups, bias=False), f)
    if act == "relu":
        return m.op("Relu", [y])
    if act == "relu6":
        return m.op("Clip", [y, m.init(np.array(0.0, np.float32)), m.init(np.array(6.0, np.float32))])
    return y


def resnet50(out_dir):
    m = Model()
    x = conv_bn(m, "x", 3, 64, 7, stride=2)
    x = m.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c = 64
    for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
        for b in range(blocks):
            s = stride if b == 0 else 1
            h = conv_bn(m, x, c, width, 1)
            h = conv_bn(m, h, width, width, 3, stride=s)
            h = conv_bn(m, h, width, 4 * width, 1, act=None)
            short = x if (b > 0) else conv_bn(m, x, c, 4 * width, 1, stride=s, act=None)
            x = m.op("Relu", [m.op("Add", [h, short])])
            c = 4 * width
    x = m.op("Flatten", [m.op("GlobalAveragePool", [x])], axis=1)
    m.op("Gemm", [x, m.init(w(1000, 2048)), m.init(w(1000, scale=0.1))], transB=1)
    save(m, "resnet50", [1, 3, 224, 224], [1, 1000], out_dir)


def mobilenetv2(out_dir):
    m = Model()
    x = conv_bn(m, "x", 3, 32, 3, stride=2, act="relu6")
    c = 32
    for t, f, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            h = x if t == 1 else conv_bn(m, x, c, c * t, 1, act="relu6")
            h = conv_bn(m, h, c * t, c * t, 3, stride=stride, groups=c * t, act="relu6")
            h = conv_bn(m, h, c * t, f, 1, act=None)
            x = m.op("Add", [h, x]) if stride == 1 and c == f else h
            c = f
    x = conv_bn(m, x, c, 1280, 1, act="relu6")
    x = m.op("Flatten", [m.op("GlobalAveragePool", [x])], axis=1)
    m.op("Gemm", [x, m.init(w(1000, 1280)), m.init(w(1000, scale=0.1))], transB=1)
    save(m, "mobilenetv2", [1, 3, 224, 224], [1, 1000], out_dir)


def bert(out_dir, layers=12, s=128, h=768, nh=12, ff=3072):
    m = Model()
    x = "x"
    for _ in range(layers):
        x = encoder_layer(m, x, s, h, nh, ff, eps=1e-12)
    save(m, "bert", [1, s, h], [1, s, h], out_dir)


if __name__ == "__main__":
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    which = sys.argv[2:] or ["resnet50", "mobilenetv2", "bert"]
    for name in which:
        {"resnet50": resnet50, "mobilenetv2": mobilenetv2, "bert": bert}[name](out_dir)
