//! Each supported ONNX op as harl ops in the open task (see [`super`]).

use super::convert::{batch_norm_affine, f32_data, node_err, product, static_shape, Converter};
use super::{ImportError, ValueId, ValueKind};
use crate::expr::{BinaryOp, CmpOp, DType, Expr, TensorRef, UnaryOp};
use crate::graph::{load, ReduceOp};
use crate::ops;
use onnx_ir::node::batch_norm::BatchNormalizationNode;
use onnx_ir::node::padding::{AutoPad, PaddingConfig2d};
use onnx_ir::{Argument, Node};

/// The ONNX ops [`super::import`] converts.
pub const SUPPORTED_OPS: &[&str] = &[
    "Add",
    "AveragePool",
    "BatchNormalization",
    "Clip",
    "Conv",
    "Div",
    "Dropout",
    "Erf",
    "Flatten",
    "Gelu",
    "Gemm",
    "GlobalAveragePool",
    "Identity",
    "LayerNormalization",
    "MatMul",
    "MaxPool",
    "Mul",
    "Relu",
    "Reshape",
    "Sigmoid",
    "Softmax",
    "Sub",
    "Tanh",
    "Transpose",
];

/// The fewest filters a 1x1 convolution is computed over flattened pixels with
/// ([`Converter::pointwise_conv`]). Its register tile then runs down the filters; with 16-32
/// filters (MobileNet-V2's projections) that tile is short, and the convolution's own layout
/// (vectors across the filters, the pixels as rows) was 1.1-1.9x faster in the network.
const POINTWISE_MIN_FILTERS: usize = 64;

impl Converter<'_> {
    pub(super) fn unsupported(&self, node: &Node) -> ImportError {
        let op = match node {
            Node::Custom(c) => c.op_type.clone(),
            other => format!("{:?}", other.node_type()),
        };
        ImportError::Unsupported {
            op,
            node: node.name().to_string(),
            opset: self.opset,
        }
    }

    pub(super) fn node(&mut self, node: &Node) -> Result<(), ImportError> {
        let name = node.name().to_string();
        let ins = node.inputs();
        let out = node
            .outputs()
            .first()
            .ok_or_else(|| node_err(&name, "no output"))?;
        let input = |i: usize| {
            ins.get(i)
                .ok_or_else(|| node_err(&name, format!("no input {i}")))
        };
        match node {
            // Initializers and constants: their readers take the data from the argument.
            Node::Constant(_) => Ok(()),
            Node::Reshape(r) => {
                let xs = self.shape(input(0)?, &name)?;
                let shape = match &r.config.shape {
                    onnx_ir::node::reshape::ReshapeInput::Static(dims) => reshaped(&xs, dims),
                    onnx_ir::node::reshape::ReshapeInput::Runtime(_) => None,
                };
                self.view(&name, input(0)?, out, shape)
            }
            Node::Flatten(f) => {
                let xs = self.shape(input(0)?, &name)?;
                let axis = f.config.axis.min(xs.len());
                let shape = vec![product(&xs[..axis]), product(&xs[axis..])];
                self.view(&name, input(0)?, out, Some(shape))
            }
            Node::Identity(_) | Node::Dropout(_) => {
                let xs = self.shape(input(0)?, &name)?;
                self.view(&name, input(0)?, out, Some(xs))
            }
            Node::Relu(_) => self.unary(&name, input(0)?, out, |e| e.max(Expr::f32(0.0))),
            Node::Sigmoid(_) => self.unary(&name, input(0)?, out, |e| {
                Expr::f32(1.0) / (Expr::f32(1.0) + (-e).exp())
            }),
            Node::Tanh(_) => self.unary(&name, input(0)?, out, |e| e.unary(UnaryOp::Tanh)),
            Node::Erf(_) => self.unary(&name, input(0)?, out, |e| e.unary(UnaryOp::Erf)),
            Node::Gelu(g) => {
                if !matches!(
                    g.config.approximate,
                    onnx_ir::node::gelu::GeluApproximate::Exact
                ) {
                    return Err(node_err(&name, "GELU's tanh approximation is not imported"));
                }
                self.gelu(&name, input(0)?, out)
            }
            // The first node of an exported exact GELU (`Converter::fuse_gelus`).
            Node::Div(_) if self.gelus.contains(&name) => self.gelu(&name, input(0)?, out),
            Node::Clip(c) => {
                let bound = |b: &Option<onnx_ir::node::clip::ClipInput>,
                             i: usize|
                 -> Result<Option<f64>, ImportError> {
                    match b {
                        None => Ok(None),
                        Some(onnx_ir::node::clip::ClipInput::Static(v)) => Ok(Some(*v)),
                        Some(onnx_ir::node::clip::ClipInput::Runtime(_)) => {
                            let a = input(i)?;
                            let d = f32_data(a, &name)?;
                            d.first()
                                .map(|&v| Some(f64::from(v)))
                                .ok_or_else(|| node_err(&name, "empty clip bound"))
                        }
                    }
                };
                let lo = bound(&c.config.min, 1)?;
                let hi = bound(&c.config.max, 2)?;
                self.unary(&name, input(0)?, out, move |mut e| {
                    if let Some(l) = lo {
                        e = e.max(Expr::f32(l as f32));
                    }
                    if let Some(h) = hi {
                        e = e.min(Expr::f32(h as f32));
                    }
                    e
                })
            }
            Node::Add(_) => self.binary(&name, BinaryOp::Add, input(0)?, input(1)?, out),
            Node::Sub(_) => self.binary(&name, BinaryOp::Sub, input(0)?, input(1)?, out),
            Node::Mul(_) => self.binary(&name, BinaryOp::Mul, input(0)?, input(1)?, out),
            Node::Div(_) => self.binary(&name, BinaryOp::Div, input(0)?, input(1)?, out),
            Node::BatchNormalization(bn) => self.batch_norm(&name, bn, out),
            Node::Conv2d(c) => self.conv(&name, ins, out, &c.config),
            Node::MaxPool2d(p) => {
                let c = &p.config;
                let window = Window {
                    kernel: c.kernel_size,
                    stride: c.strides,
                    dilation: c.dilation,
                    padding: &c.padding,
                    auto_pad: &c.auto_pad,
                };
                self.pool(&name, input(0)?, out, &window, Pool::Max)
            }
            Node::AveragePool2d(p) => {
                let c = &p.config;
                let window = Window {
                    kernel: c.kernel_size,
                    stride: c.strides,
                    dilation: c.dilation,
                    padding: &c.padding,
                    auto_pad: &c.auto_pad,
                };
                let kind = Pool::Average {
                    count_include_pad: c.count_include_pad,
                };
                self.pool(&name, input(0)?, out, &window, kind)
            }
            Node::GlobalAveragePool(_) => self.global_pool(&name, input(0)?, out),
            Node::Transpose(t) => self.transpose(&name, input(0)?, out, &t.config.perm),
            Node::MatMul(_) => self.matmul(&name, input(0)?, input(1)?, out),
            Node::Gemm(gm) => self.gemm(&name, ins, out, &gm.config),
            // onnx-ir's fusion of Gemm (transB = 1) or MatMul + Add with a constant weight.
            Node::Linear(l) => self.linear(&name, ins, out, l.config.transpose_weight),
            Node::Softmax(s) => {
                let axis = s.config.axis;
                self.start(&name)?;
                let x = self.tensor(input(0)?, &name)?;
                let t =
                    ops::softmax(&mut self.open_mut().b, x, axis as isize).map_err(|source| {
                        ImportError::Op {
                            node: name.clone(),
                            source: Box::new(source),
                        }
                    })?;
                self.finish_node(&name, t, out)
            }
            Node::LayerNormalization(l) => {
                let x_shape = self.shape(input(0)?, &name)?;
                let rank = x_shape.len() as i64;
                if l.config.axis != -1 && l.config.axis != rank - 1 {
                    return Err(node_err(
                        &name,
                        "layer norm over more than the last axis is not imported",
                    ));
                }
                let last = *x_shape.last().unwrap_or(&0);
                self.start(&name)?;
                let x = self.tensor(input(0)?, &name)?;
                let gamma = self.tensor_as(input(1)?, &name, &[last])?;
                let beta = match ins.get(2).filter(|a| !a.is_optional()) {
                    Some(b) => self.tensor_as(b, &name, &[last])?,
                    None => {
                        let v = self.add_value(
                            &format!("{name}.beta"),
                            vec![last],
                            ValueKind::Weight(vec![0.0; last]),
                        );
                        self.bind(v, &[last])
                    }
                };
                let t = ops::layer_norm(&mut self.open_mut().b, x, gamma, beta, l.config.epsilon)
                    .map_err(|source| ImportError::Op {
                    node: name.clone(),
                    source: Box::new(source),
                })?;
                self.finish_node(&name, t, out)
            }
            other => Err(self.unsupported(other)),
        }
    }

    /// Batch norm not folded into a convolution: `x * s + (beta - mean * s)` per channel.
    fn batch_norm(
        &mut self,
        node: &str,
        bn: &BatchNormalizationNode,
        out: &Argument,
    ) -> Result<(), ImportError> {
        let x = bn
            .inputs
            .first()
            .ok_or_else(|| node_err(node, "batch norm needs five inputs"))?;
        let shape = self.shape(x, node)?;
        let c = *shape
            .get(1)
            .ok_or_else(|| node_err(node, "batch norm of a 1-D tensor"))?;
        let (scale, shift) = batch_norm_affine(bn, c)?;
        let s: Vec<f32> = scale.iter().map(|&v| v as f32).collect();
        let t: Vec<f32> = shift.iter().map(|&v| v as f32).collect();
        let mut per_channel = vec![c];
        per_channel.extend(std::iter::repeat_n(1, shape.len().saturating_sub(2)));
        let sv = self.add_value(
            &format!("{node}.scale"),
            per_channel.clone(),
            ValueKind::Weight(s),
        );
        let tv = self.add_value(
            &format!("{node}.shift"),
            per_channel.clone(),
            ValueKind::Weight(t),
        );
        self.elementwise(node, x, out, |cv, xt| {
            let st = cv.bind(sv, &per_channel);
            let tt = cv.bind(tv, &per_channel);
            let b = &mut cv.open_mut().b;
            let err = |source| ImportError::Op {
                node: node.to_string(),
                source: Box::new(source),
            };
            let y = ops::broadcast_binary(b, BinaryOp::Mul, xt, st).map_err(err)?;
            ops::broadcast_binary(b, BinaryOp::Add, y, tt).map_err(err)
        })
    }

    fn conv(
        &mut self,
        node: &str,
        ins: &[Argument],
        out: &Argument,
        c: &onnx_ir::node::conv2d::Conv2dConfig,
    ) -> Result<(), ImportError> {
        let x_arg = ins.first().ok_or_else(|| node_err(node, "no input"))?;
        let w_arg = ins.get(1).ok_or_else(|| node_err(node, "no weight"))?;
        let xs = self.shape(x_arg, node)?;
        if xs.len() != 4 {
            return Err(node_err(node, "a 2-D convolution needs an NCHW input"));
        }
        let pads = Window {
            kernel: c.kernel_size,
            stride: c.stride,
            dilation: c.dilation,
            padding: &c.padding,
            auto_pad: &c.auto_pad,
        }
        .pads(&xs);
        self.start(node)?;
        let err = |source| ImportError::Op {
            node: node.to_string(),
            source: Box::new(source),
        };
        let filters = self.shape(w_arg, node)?.first().copied().unwrap_or(0);
        let pointwise = c.kernel_size == [1, 1]
            && c.stride == [1, 1]
            && c.dilation == [1, 1]
            && c.groups == 1
            && pads == [0; 4]
            && filters >= POINTWISE_MIN_FILTERS;
        if pointwise {
            return self.pointwise_conv(node, x_arg, w_arg, ins, &xs, out);
        }
        // The activation first, then the weights: the kernel's inputs in the order the op
        // library's convolutions take them.
        let mut x = self.tensor(x_arg, node)?;
        let (wv, bias) = self.conv_weight(node, w_arg, ins)?;
        let ws = self.values[wv].shape.clone();
        let w = self.bind(wv, &ws);
        let [t, l, bo, r] = pads;
        let symmetric = t == bo && l == r;
        if !symmetric {
            x = self.pad(x, &xs, [t, l, bo, r], 0.0);
        }
        let params = ops::Conv2dParams {
            stride: (c.stride[0], c.stride[1]),
            pad: if symmetric { (t, l) } else { (0, 0) },
            dilation: (c.dilation[0], c.dilation[1]),
            groups: c.groups,
        };
        let mut y = ops::conv2d(&mut self.open_mut().b, x, w, params).map_err(err)?;
        if let Some(bv) = bias {
            let f = product(&self.values[bv].shape);
            let bt = self.bind(bv, &[f, 1, 1]);
            y = ops::broadcast_binary(&mut self.open_mut().b, BinaryOp::Add, y, bt).map_err(err)?;
        }
        self.finish_node(node, y, out)
    }

    /// The exact GELU of `x`, elementwise (it continues `x`'s task where it can).
    fn gelu(&mut self, node: &str, x: &Argument, out: &Argument) -> Result<(), ImportError> {
        self.elementwise(node, x, out, |cv, x| {
            ops::gelu(&mut cv.open_mut().b, x).map_err(|source| ImportError::Op {
                node: cv.current(),
                source: Box::new(source),
            })
        })
    }

    /// A convolution's weight and bias values: those of the batch norm folded into it, or its
    /// own inputs.
    fn conv_weight(
        &mut self,
        node: &str,
        w_arg: &Argument,
        ins: &[Argument],
    ) -> Result<(ValueId, Option<ValueId>), ImportError> {
        if let Some((wv, bv)) = self.folded.get(node).copied() {
            return Ok((wv, Some(bv)));
        }
        let wv = self.value(w_arg, node)?;
        let bias = match ins.get(2).filter(|a| !a.is_optional()) {
            Some(b) => Some(self.value(b, node)?),
            None => None,
        };
        Ok((wv, bias))
    }

    /// A 1x1 convolution of stride 1 without padding or groups, computed as a matrix product
    /// over flattened pixels: `y[n, f, p] = sum_c w[f, c] * x[n, c, p]`, `p` the `H*W` pixels,
    /// which are contiguous in both tensors. Its vector axis is then the pixels (3136 at 56x56)
    /// rather than a 56-wide row or a filter-major layout, and its epilogue is computed in the
    /// write-back; the task keeps this view (`Converter::task_view`), so the bias, a residual
    /// add and the activation that follow are read in it too.
    fn pointwise_conv(
        &mut self,
        node: &str,
        x_arg: &Argument,
        w_arg: &Argument,
        ins: &[Argument],
        xs: &[usize],
        out: &Argument,
    ) -> Result<(), ImportError> {
        let err = |source| ImportError::Op {
            node: node.to_string(),
            source: Box::new(source),
        };
        let (n, ch, pixels) = (xs[0], xs[1], xs[2].saturating_mul(xs[3]));
        let x = self.tensor_as(x_arg, node, &[n, ch, pixels])?;
        let (wv, bias) = self.conv_weight(node, w_arg, ins)?;
        let f = self.values[wv].shape.first().copied().unwrap_or(0);
        if product(&self.values[wv].shape) != f.saturating_mul(ch) {
            return Err(node_err(
                node,
                "a 1x1 convolution's weight is not [F, C, 1, 1]",
            ));
        }
        let w = self.bind(wv, &[f, ch]);
        let ax = Expr::axis;
        let body = load(w, [ax(1), ax(3)]) * load(x, [ax(0), ax(3), ax(2)]);
        let name = self.fresh("conv1x1_");
        let mut y = self.open_mut().b.reduce(
            &name,
            &[n, f, pixels],
            DType::F32,
            ReduceOp::Sum,
            &[ch],
            body,
        );
        if let Some(bv) = bias {
            let bt = self.bind(bv, &[f, 1]);
            y = ops::broadcast_binary(&mut self.open_mut().b, BinaryOp::Add, y, bt).map_err(err)?;
        }
        let shape = vec![n, f, xs[2], xs[3]];
        self.finish_node_as(node, y, out, Some(shape))
    }

    /// `x` (NCHW) padded by (top, left, bottom, right) with `fill`.
    fn pad(&mut self, x: TensorRef, xs: &[usize], pads: [usize; 4], fill: f32) -> TensorRef {
        let [t, l, bo, r] = pads;
        let shape = vec![
            xs[0],
            xs[1],
            xs[2].saturating_add(t).saturating_add(bo),
            xs[3].saturating_add(l).saturating_add(r),
        ];
        let int = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        let (ti, li) = (int(t), int(l));
        let ax = Expr::axis;
        let cond = ax(2)
            .cmp(CmpOp::Ge, Expr::int(ti))
            .and(ax(2).cmp(CmpOp::Lt, Expr::int(ti.saturating_add(int(xs[2])))))
            .and(ax(3).cmp(CmpOp::Ge, Expr::int(li)))
            .and(ax(3).cmp(CmpOp::Lt, Expr::int(li.saturating_add(int(xs[3])))));
        let idx = vec![ax(0), ax(1), ax(2) - Expr::int(ti), ax(3) - Expr::int(li)];
        let name = self.fresh("pad");
        let body = Expr::select(cond, load(x, idx), Expr::f32(fill));
        self.open_mut().b.compute(&name, &shape, DType::F32, body)
    }

    fn pool(
        &mut self,
        node: &str,
        x_arg: &Argument,
        out: &Argument,
        window: &Window<'_>,
        kind: Pool,
    ) -> Result<(), ImportError> {
        let xs = self.shape(x_arg, node)?;
        let (k, s) = (window.kernel, window.stride);
        if xs.len() != 4 || k.contains(&0) || s.contains(&0) {
            return Err(node_err(
                node,
                "pooling needs an NCHW tensor and positive windows",
            ));
        }
        if window.dilation != [1, 1] {
            return Err(node_err(node, "dilated pooling is not imported"));
        }
        let pads = window.pads(&xs);
        let max = matches!(kind, Pool::Max);
        if pads != [0; 4]
            && kind
                == (Pool::Average {
                    count_include_pad: false,
                })
        {
            return Err(node_err(
                node,
                "average pooling over padding without count_include_pad is not imported",
            ));
        }
        let [t, l, bo, r] = pads;
        let (Some(oh), Some(ow)) = (
            xs[2]
                .saturating_add(t)
                .saturating_add(bo)
                .checked_sub(k[0])
                .map(|v| v / s[0] + 1),
            xs[3]
                .saturating_add(l)
                .saturating_add(r)
                .checked_sub(k[1])
                .map(|v| v / s[1] + 1),
        ) else {
            return Err(node_err(
                node,
                "the pooling window is larger than the padded input",
            ));
        };
        let ys = vec![xs[0], xs[1], oh, ow];
        // Where ONNX infers a shape it must be the floor one (no ceil_mode windows).
        if static_shape(out, node).is_ok_and(|o| o != ys) {
            return Err(node_err(
                node,
                "pooling with ceil_mode windows is not imported",
            ));
        }
        self.start(node)?;
        let mut x = self.tensor(x_arg, node)?;
        if pads != [0; 4] {
            // The lowest finite float stands for -inf (graphs hold finite constants): it
            // never wins a max against a finite input.
            x = self.pad(x, &xs, pads, if max { f32::MIN } else { 0.0 });
        }
        let ax = Expr::axis;
        let idx = vec![
            ax(0),
            ax(1),
            ax(2) * Expr::int(i64::try_from(s[0]).unwrap_or(i64::MAX)) + ax(4),
            ax(3) * Expr::int(i64::try_from(s[1]).unwrap_or(i64::MAX)) + ax(5),
        ];
        let name = self.fresh("pool");
        let shape = ys.clone();
        let y = if max {
            self.open_mut()
                .b
                .reduce(&name, &shape, DType::F32, ReduceOp::Max, &k, load(x, idx))
        } else {
            let inv = 1.0 / (k[0] * k[1]) as f32;
            self.open_mut().b.reduce(
                &name,
                &shape,
                DType::F32,
                ReduceOp::Sum,
                &k,
                load(x, idx) * Expr::f32(inv),
            )
        };
        self.finish_node(node, y, out)
    }

    fn global_pool(
        &mut self,
        node: &str,
        x_arg: &Argument,
        out: &Argument,
    ) -> Result<(), ImportError> {
        let xs = self.shape(x_arg, node)?;
        if xs.len() != 4 {
            return Err(node_err(node, "global pooling needs an NCHW tensor"));
        }
        self.start(node)?;
        let x = self.tensor(x_arg, node)?;
        let ax = Expr::axis;
        let inv = 1.0 / (xs[2] * xs[3]).max(1) as f32;
        let name = self.fresh("global_pool");
        let y = self.open_mut().b.reduce(
            &name,
            &[xs[0], xs[1], 1, 1],
            DType::F32,
            ReduceOp::Sum,
            &[xs[2], xs[3]],
            load(x, vec![ax(0), ax(1), ax(4), ax(5)]) * Expr::f32(inv),
        );
        self.finish_node(node, y, out)
    }

    fn transpose(
        &mut self,
        node: &str,
        x_arg: &Argument,
        out: &Argument,
        perm: &[i64],
    ) -> Result<(), ImportError> {
        let xs = self.shape(x_arg, node)?;
        let rank = xs.len();
        let perm: Vec<usize> = perm
            .iter()
            .map(|&p| {
                usize::try_from(if p < 0 { p + rank as i64 } else { p }).unwrap_or(usize::MAX)
            })
            .collect();
        let mut seen = vec![false; rank];
        for &p in &perm {
            match seen.get_mut(p) {
                Some(s) if !*s => *s = true,
                _ => return Err(node_err(node, format!("{perm:?} is not a permutation"))),
            }
        }
        if perm.len() != rank {
            return Err(node_err(node, format!("{perm:?} is not a permutation")));
        }
        self.start(node)?;
        let x = self.tensor(x_arg, node)?;
        // Output axis j is input axis perm[j]: the input index at perm[j] is Axis(j).
        let mut idx = vec![Expr::int(0); rank];
        for (j, &p) in perm.iter().enumerate() {
            idx[p] = Expr::axis(j);
        }
        let shape: Vec<usize> = perm.iter().map(|&p| xs[p]).collect();
        let name = self.fresh("transpose");
        let y = self
            .open_mut()
            .b
            .compute(&name, &shape, DType::F32, load(x, idx));
        self.finish_node(node, y, out)
    }

    fn matmul(
        &mut self,
        node: &str,
        a: &Argument,
        b: &Argument,
        out: &Argument,
    ) -> Result<(), ImportError> {
        let (sa, sb) = (self.shape(a, node)?, self.shape(b, node)?);
        if sa.len() < 2 || sb.len() < 2 {
            return Err(node_err(
                node,
                "a matrix product of vectors is not imported",
            ));
        }
        let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
        let (k2, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
        if k != k2 {
            return Err(node_err(
                node,
                format!("inner extents differ: {sa:?} x {sb:?}"),
            ));
        }
        self.start(node)?;
        let err = |source| ImportError::Op {
            node: node.to_string(),
            source: Box::new(source),
        };
        let y = if sb.len() == 2 {
            // Every row of a (batched or not) times one matrix.
            let rows = product(&sa[..sa.len() - 1]);
            let at = self.tensor_as(a, node, &[rows, k])?;
            let bt = self.tensor_as(b, node, &[k, n])?;
            ops::matmul(&mut self.open_mut().b, at, bt, false, false).map_err(err)?
        } else if sa.len() == sb.len() && sa[..sa.len() - 2] == sb[..sb.len() - 2] {
            let batch = product(&sa[..sa.len() - 2]);
            let at = self.tensor_as(a, node, &[batch, m, k])?;
            let bt = self.tensor_as(b, node, &[batch, k, n])?;
            ops::batch_matmul(&mut self.open_mut().b, at, bt, false, false).map_err(err)?
        } else {
            return Err(node_err(
                node,
                format!("broadcast batch extents {sa:?} x {sb:?} are not imported"),
            ));
        };
        let mut shape = sa[..sa.len() - 1].to_vec();
        shape.push(n);
        self.finish_node_as(node, y, out, Some(shape))
    }

    /// `x @ w (+ bias)`, `w` constant `[K, N]` (or `[N, K]` when `transpose`), `x` any rank
    /// `[.., K]`: its rows in one matrix product.
    fn linear(
        &mut self,
        node: &str,
        ins: &[Argument],
        out: &Argument,
        transpose: bool,
    ) -> Result<(), ImportError> {
        let x = ins.first().ok_or_else(|| node_err(node, "no input"))?;
        let w = ins.get(1).ok_or_else(|| node_err(node, "no weight"))?;
        let (sx, sw) = (self.shape(x, node)?, self.shape(w, node)?);
        let (Some(&k), 2) = (sx.last(), sw.len()) else {
            return Err(node_err(
                node,
                "a linear layer needs [.., K] inputs and a 2-D weight",
            ));
        };
        self.start(node)?;
        let rows = product(&sx) / k.max(1);
        let xt = self.tensor_as(x, node, &[rows, k])?;
        let wt = self.tensor(w, node)?;
        let err = |source| ImportError::Op {
            node: node.to_string(),
            source: Box::new(source),
        };
        let y = ops::matmul(&mut self.open_mut().b, xt, wt, false, transpose).map_err(err)?;
        let y = self.add_bias(node, y, ins.get(2))?;
        let n = self.open_mut().b.shape(y).last().copied().unwrap_or(0);
        let mut shape = sx[..sx.len() - 1].to_vec();
        shape.push(n);
        self.finish_node_as(node, y, out, Some(shape))
    }

    fn gemm(
        &mut self,
        node: &str,
        ins: &[Argument],
        out: &Argument,
        c: &onnx_ir::node::gemm::GemmConfig,
    ) -> Result<(), ImportError> {
        let a = ins.first().ok_or_else(|| node_err(node, "no input A"))?;
        let b = ins.get(1).ok_or_else(|| node_err(node, "no input B"))?;
        if c.alpha != 1.0 || c.beta != 1.0 {
            return Err(node_err(
                node,
                "Gemm with alpha or beta other than 1 is not imported",
            ));
        }
        self.start(node)?;
        let at = self.tensor(a, node)?;
        let bt = self.tensor(b, node)?;
        let err = |source| ImportError::Op {
            node: node.to_string(),
            source: Box::new(source),
        };
        let y = ops::matmul(
            &mut self.open_mut().b,
            at,
            bt,
            c.trans_a != 0,
            c.trans_b != 0,
        )
        .map_err(err)?;
        let y = self.add_bias(node, y, ins.get(2))?;
        self.finish_node(node, y, out)
    }

    /// `y + bias` (broadcast) when the node has a bias input, else `y`.
    fn add_bias(
        &mut self,
        node: &str,
        y: TensorRef,
        bias: Option<&Argument>,
    ) -> Result<TensorRef, ImportError> {
        let Some(bias) = bias.filter(|a| !a.is_optional()) else {
            return Ok(y);
        };
        let bt = self.tensor(bias, node)?;
        ops::broadcast_binary(&mut self.open_mut().b, BinaryOp::Add, y, bt).map_err(|source| {
            ImportError::Op {
                node: node.to_string(),
                source: Box::new(source),
            }
        })
    }
}

/// The shape of ONNX `Reshape(x, dims)`: 0 copies x's extent, -1 takes what is left.
fn reshaped(xs: &[usize], dims: &[i64]) -> Option<Vec<usize>> {
    let total = product(xs);
    let mut out = Vec::with_capacity(dims.len());
    let mut infer = None;
    for (i, &d) in dims.iter().enumerate() {
        match d {
            0 => out.push(*xs.get(i)?),
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            d if d > 0 => out.push(usize::try_from(d).ok()?),
            _ => return None,
        }
    }
    let known = product(&out);
    if let Some(i) = infer {
        if known == 0 || !total.is_multiple_of(known) {
            return None;
        }
        out[i] = total / known;
    }
    (product(&out) == total).then_some(out)
}

/// Which reduction a pooling node is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pool {
    Max,
    Average { count_include_pad: bool },
}

/// The geometry of a 2-D window op (convolution, pooling).
struct Window<'c> {
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
    padding: &'c PaddingConfig2d,
    auto_pad: &'c AutoPad,
}

impl Window<'_> {
    /// (top, left, bottom, right) for an NCHW input of shape `xs`: the explicit pads, or those
    /// of `auto_pad = SAME_UPPER / SAME_LOWER` (the output is ceil(input / stride)).
    fn pads(&self, xs: &[usize]) -> [usize; 4] {
        if !matches!(self.auto_pad, AutoPad::SameUpper | AutoPad::SameLower) {
            return match self.padding {
                PaddingConfig2d::Valid => [0; 4],
                PaddingConfig2d::Explicit(t, l, b, r) => [*t, *l, *b, *r],
            };
        }
        let one = |i: usize, x: usize| -> (usize, usize) {
            let (k, s, d) = (self.kernel[i], self.stride[i].max(1), self.dilation[i]);
            let out = x.div_ceil(s);
            let eff = d * k.saturating_sub(1) + 1;
            let total = (out.saturating_sub(1) * s + eff).saturating_sub(x);
            let small = total / 2;
            if matches!(self.auto_pad, AutoPad::SameLower) {
                (total - small, small)
            } else {
                (small, total - small)
            }
        };
        let (t, b) = one(0, xs[2]);
        let (l, r) = one(1, xs[3]);
        [t, l, b, r]
    }
}
