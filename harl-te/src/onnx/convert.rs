//! From onnx-ir's typed nodes to harl tasks (see the module docs of [`super`]).

use super::{Call, ImportError, Network, Task, Value, ValueId, ValueKind};
use crate::expr::{BinaryOp, DType, Expr, TensorRef};
use crate::graph::GraphBuilder;
use crate::ops;
use onnx_ir::node::batch_norm::{BatchNormConfig, BatchNormalizationNode};
use onnx_ir::{Argument, Node, OnnxGraph};
use std::collections::{HashMap, HashSet};

/// An operand of an elementwise op: a tensor of the open task, or a scalar constant.
pub(super) enum Operand {
    Tensor(TensorRef),
    Scalar(f64),
}

/// The task being built: its graph so far and what it binds.
pub(super) struct Open {
    pub(super) b: GraphBuilder,
    /// The values bound to the graph's inputs, in order.
    pub(super) ext: Vec<ValueId>,
    /// Graph input of each (value, declared shape) already bound.
    pub(super) refs: HashMap<(ValueId, Vec<usize>), TensorRef>,
    /// The task's current output and its ONNX name and shape.
    pub(super) out: TensorRef,
    pub(super) out_name: String,
    pub(super) out_shape: Vec<usize>,
    pub(super) nodes: Vec<String>,
    pub(super) stages: usize,
}

pub(super) struct Converter<'g> {
    pub(super) opset: usize,
    pub(super) values: Vec<Value>,
    pub(super) by_name: HashMap<String, ValueId>,
    /// Consumers (and graph outputs) of each tensor name.
    pub(super) uses: HashMap<String, usize>,
    pub(super) alias: HashMap<String, String>,
    /// Convolutions with a batch norm folded in: their new weight and bias values.
    pub(super) folded: HashMap<String, (ValueId, ValueId)>,
    pub(super) skip: HashSet<String>,
    /// The Div nodes that start an exported exact GELU ([`Converter::fuse_gelus`]).
    pub(super) gelus: HashSet<String>,
    pub(super) tasks: Vec<Task>,
    pub(super) task_of: HashMap<String, usize>,
    pub(super) calls: Vec<Call>,
    pub(super) open: Option<Open>,
    pub(super) graph: &'g OnnxGraph,
}

pub(super) fn convert(g: &OnnxGraph, opset: usize) -> Result<Network, ImportError> {
    let mut cv = Converter {
        opset,
        values: Vec::new(),
        by_name: HashMap::new(),
        uses: HashMap::new(),
        alias: HashMap::new(),
        folded: HashMap::new(),
        skip: HashSet::new(),
        gelus: HashSet::new(),
        tasks: Vec::new(),
        task_of: HashMap::new(),
        calls: Vec::new(),
        open: None,
        graph: g,
    };
    let mut inputs = Vec::new();
    for arg in &g.inputs {
        let shape = static_shape(arg, "graph input")?;
        inputs.push(cv.add_value(&arg.name, shape, ValueKind::Input));
    }
    cv.fold_batch_norms()?;
    cv.fuse_gelus();
    cv.count_uses();
    for node in &g.nodes {
        if cv.skip.contains(node.name()) {
            continue;
        }
        cv.node(node)?;
    }
    cv.close()?;
    let out_arg = g
        .outputs
        .first()
        .ok_or_else(|| ImportError::Parse("the model has no output".into()))?;
    if g.outputs.len() > 1 {
        return Err(ImportError::Node {
            node: out_arg.name.clone(),
            why: format!("{} graph outputs; harl imports one", g.outputs.len()),
        });
    }
    let out_name = cv.resolve(&out_arg.name);
    let output = *cv.by_name.get(&out_name).ok_or_else(|| ImportError::Node {
        node: out_name.clone(),
        why: "the graph output is not computed by any node".into(),
    })?;
    Ok(Network {
        values: cv.values,
        inputs,
        output,
        tasks: cv.tasks,
        calls: cv.calls,
    })
}

/// The nodes reading each tensor name of a graph, and its outputs.
struct Readers<'g> {
    nodes: HashMap<&'g str, Vec<&'g Node>>,
    outputs: HashSet<&'g str>,
}

impl<'g> Readers<'g> {
    fn of(g: &'g OnnxGraph) -> Self {
        let mut nodes: HashMap<&str, Vec<&Node>> = HashMap::new();
        for node in &g.nodes {
            for a in node.inputs() {
                nodes.entry(a.name.as_str()).or_default().push(node);
            }
        }
        let outputs = g.outputs.iter().map(|a| a.name.as_str()).collect();
        Readers { nodes, outputs }
    }

    /// How many nodes and graph outputs read `name`.
    fn count(&self, name: &str) -> usize {
        self.nodes.get(name).map_or(0, Vec::len) + usize::from(self.outputs.contains(name))
    }

    /// The one reader of `name`, where nothing else (a graph output included) reads it.
    fn only(&self, name: &str) -> Option<&'g Node> {
        match self.nodes.get(name).map(Vec::as_slice) {
            Some([n]) if !self.outputs.contains(name) => Some(*n),
            _ => None,
        }
    }
}

pub(super) fn node_err(node: &str, why: impl Into<String>) -> ImportError {
    ImportError::Node {
        node: node.to_string(),
        why: why.into(),
    }
}

pub(super) fn static_shape(arg: &Argument, node: &str) -> Result<Vec<usize>, ImportError> {
    match &arg.ty {
        onnx_ir::ArgType::Tensor(t) => t
            .static_shape_known()
            .ok_or_else(|| node_err(node, format!("tensor `{}` has no static shape", arg.name))),
        onnx_ir::ArgType::ScalarTensor(_) | onnx_ir::ArgType::ScalarNative(_) => Ok(vec![]),
        onnx_ir::ArgType::Shape(_) => Err(node_err(
            node,
            format!(
                "`{}` is a shape value; harl imports static shapes only",
                arg.name
            ),
        )),
    }
}

pub(super) fn f32_data(arg: &Argument, node: &str) -> Result<Vec<f32>, ImportError> {
    let data = arg
        .value()
        .ok_or_else(|| node_err(node, format!("`{}` is not a constant", arg.name)))?;
    if let Ok(s) = data.as_slice::<f32>() {
        return Ok(s.to_vec());
    }
    if let Ok(s) = data.as_slice::<f64>() {
        return Ok(s.iter().map(|&x| x as f32).collect());
    }
    Err(node_err(
        node,
        format!("constant `{}` is not f32 ({:?})", arg.name, data.dtype()),
    ))
}

/// The element count of `shape`, saturating: a shape from a hostile file that overflows is
/// then too large for every check that follows (the graph's own limits reject it).
/// A batch norm's per-channel affine map `y = x * scale + shift` (f64): scale =
/// gamma / sqrt(var + eps), shift = beta - mean * scale. Its four parameters must be constants
/// of `channels` values each. The one computation behind both a folded batch norm and one left
/// as its own op.
pub(super) fn batch_norm_affine(
    bn: &BatchNormalizationNode,
    channels: usize,
) -> Result<(Vec<f64>, Vec<f64>), ImportError> {
    let node = bn.name.as_str();
    let eps = match &bn.config {
        BatchNormConfig::Static(c) => c.epsilon,
        BatchNormConfig::Runtime(c) => c.epsilon,
    };
    let param = |i: usize| -> Result<Vec<f64>, ImportError> {
        let arg = bn
            .inputs
            .get(i)
            .ok_or_else(|| node_err(node, "batch norm needs five inputs"))?;
        let d = f32_data(arg, node)?;
        if d.len() != channels || channels == 0 {
            return Err(node_err(
                node,
                "batch norm parameters do not match the channels",
            ));
        }
        Ok(d.into_iter().map(f64::from).collect())
    };
    let (gamma, beta, mean, var) = (param(1)?, param(2)?, param(3)?, param(4)?);
    let scale: Vec<f64> = (0..channels)
        .map(|k| gamma[k] / (var[k] + eps).sqrt())
        .collect();
    let shift = (0..channels)
        .map(|k| beta[k] - mean[k] * scale[k])
        .collect();
    Ok((scale, shift))
}

pub(super) fn product(shape: &[usize]) -> usize {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .unwrap_or(usize::MAX)
}

impl Converter<'_> {
    pub(super) fn add_value(&mut self, name: &str, shape: Vec<usize>, kind: ValueKind) -> ValueId {
        self.values.push(Value {
            name: name.to_string(),
            shape,
            kind,
        });
        let id = self.values.len() - 1;
        self.by_name.insert(name.to_string(), id);
        id
    }

    pub(super) fn resolve(&self, name: &str) -> String {
        let mut n = name.to_string();
        // Aliases point from a folded batch norm's output to its convolution's: one step each.
        for _ in 0..=self.alias.len() {
            match self.alias.get(&n) {
                Some(next) => n = next.clone(),
                None => break,
            }
        }
        n
    }

    pub(super) fn count_uses(&mut self) {
        let mut uses: HashMap<String, usize> = HashMap::new();
        for node in &self.graph.nodes {
            if self.skip.contains(node.name()) {
                continue;
            }
            for a in node.inputs() {
                *uses.entry(self.resolve(&a.name)).or_default() += 1;
            }
        }
        for a in &self.graph.outputs {
            *uses.entry(self.resolve(&a.name)).or_default() += 1;
        }
        self.uses = uses;
    }

    /// Folds each batch norm whose input is a convolution's output read by nothing else into
    /// that convolution's weights: w' = w * s, b' = (b - mean) * s + beta, s = gamma / sqrt(var + eps).
    pub(super) fn fold_batch_norms(&mut self) -> Result<(), ImportError> {
        let g = self.graph;
        let readers = Readers::of(g);
        for node in &g.nodes {
            let Node::BatchNormalization(bn) = node else {
                continue;
            };
            let Some(x) = bn.inputs.first() else { continue };
            let conv = g.nodes.iter().find_map(|n| match n {
                Node::Conv2d(c) if c.outputs.first().is_some_and(|o| o.name == x.name) => Some(c),
                _ => None,
            });
            let Some(conv) = conv else { continue };
            if readers.only(&x.name).is_none() || bn.inputs.len() < 5 {
                continue;
            }
            let (Some(w), Some(out)) = (conv.inputs.get(1), bn.outputs.first()) else {
                continue;
            };
            if !w.is_static() || bn.inputs[1..5].iter().any(|a| !a.is_static()) {
                continue;
            }
            let wshape = static_shape(w, &conv.name)?;
            let mut wd = f32_data(w, &conv.name)?;
            let f = *wshape.first().unwrap_or(&0);
            let (scale, shift) = batch_norm_affine(bn, f)?;
            let mut bias = match conv.inputs.get(2).filter(|a| !a.is_optional()) {
                Some(b) => f32_data(b, &conv.name)?,
                None => vec![0.0; f],
            };
            if bias.len() != f || wd.len() % f != 0 {
                return Err(node_err(&conv.name, "bias and weights do not match"));
            }
            let per = wd.len() / f;
            for k in 0..f {
                for x in &mut wd[k * per..(k + 1) * per] {
                    *x = (f64::from(*x) * scale[k]) as f32;
                }
                bias[k] = (f64::from(bias[k]) * scale[k] + shift[k]) as f32;
            }
            let wv = self.add_value(
                &format!("{}.folded_w", conv.name),
                wshape,
                ValueKind::Weight(wd),
            );
            let bv = self.add_value(
                &format!("{}.folded_b", conv.name),
                vec![f],
                ValueKind::Weight(bias),
            );
            self.folded.insert(conv.name.clone(), (wv, bv));
            self.skip.insert(bn.name.clone());
            self.alias.insert(out.name.clone(), x.name.clone());
        }
        Ok(())
    }

    /// Finds the exact GELU as exporters write it, `(x * (1 + erf(x / sqrt(2)))) * 0.5` (Div,
    /// Erf, Add, Mul, Mul; the commutative ops' operands in either order, each intermediate
    /// read once). Its Div then converts as one GELU of `x`, the other four nodes are skipped,
    /// and the last one's output names the Div's. `x` is then read once, so the GELU joins the
    /// task of the linear layer that makes `x` (BERT's FFN).
    pub(super) fn fuse_gelus(&mut self) {
        let g = self.graph;
        let readers = Readers::of(g);
        let only_reader = |name: &str| readers.only(name);
        let out = |n: &Node| n.outputs().first().map(|o| o.name.clone());
        // The operand of binary node `n` other than `name`, if `name` is one of its two.
        let other = |n: &Node, name: &str| -> Option<Argument> {
            match n.inputs() {
                [a, b] if a.name == name => Some(b.clone()),
                [a, b] if b.name == name => Some(a.clone()),
                _ => None,
            }
        };
        let near = |arg: &Argument, want: f32| {
            (arg.is_static() || arg.is_constant())
                && f32_data(arg, "")
                    .is_ok_and(|d| d.len() == 1 && (d[0] - want).abs() <= 1e-4 * want)
        };
        for node in &g.nodes {
            let Node::Div(_) = node else { continue };
            let [x, c] = node.inputs() else { continue };
            if x.name.is_empty() || !near(c, std::f32::consts::SQRT_2) {
                continue;
            }
            let chain = (|| {
                let erf = only_reader(&out(node)?)?;
                let Node::Erf(_) = erf else { return None };
                let erf_out = out(erf)?;
                let add = only_reader(&erf_out)?;
                let Node::Add(_) = add else { return None };
                near(&other(add, &erf_out)?, 1.0).then_some(())?;
                let add_out = out(add)?;
                let mul = only_reader(&add_out)?;
                let Node::Mul(_) = mul else { return None };
                (other(mul, &add_out)?.name == x.name).then_some(())?;
                let mul_out = out(mul)?;
                let half = only_reader(&mul_out)?;
                let Node::Mul(_) = half else { return None };
                near(&other(half, &mul_out)?, 0.5).then_some(())?;
                // x feeds the Div and this Mul only.
                (readers.count(&x.name) == 2).then_some(())?;
                Some(([erf, add, mul, half], out(half)?))
            })();
            let (Some((skipped, last)), Some(div_out)) = (chain, out(node)) else {
                continue;
            };
            self.skip
                .extend(skipped.iter().map(|n| n.name().to_string()));
            self.alias.insert(last, div_out);
            self.gelus.insert(node.name().to_string());
        }
    }

    /// The value an argument names: a computed or input value, or a weight made from its
    /// constant data.
    pub(super) fn value(&mut self, arg: &Argument, node: &str) -> Result<ValueId, ImportError> {
        // Initializers reach nodes unnamed: their data id names them.
        let name = match arg.value_source {
            onnx_ir::ValueSource::Static(id) if arg.name.is_empty() => format!("#static{id}"),
            _ => self.resolve(&arg.name),
        };
        if let Some(&v) = self.by_name.get(&name) {
            return Ok(v);
        }
        if arg.is_static() || arg.is_constant() {
            let shape = static_shape(arg, node)?;
            let data = f32_data(arg, node)?;
            if data.len() != product(&shape) {
                return Err(node_err(
                    node,
                    format!("constant `{name}` has the wrong size"),
                ));
            }
            return Ok(self.add_value(&name, shape, ValueKind::Weight(data)));
        }
        Err(node_err(
            node,
            format!("`{name}` is not computed before this node"),
        ))
    }

    /// The shape of an input argument: its value's if it has one (computed shapes are
    /// harl's, which onnx-ir does not always infer), else the one onnx-ir inferred.
    pub(super) fn shape(&self, arg: &Argument, node: &str) -> Result<Vec<usize>, ImportError> {
        if self.is_open_output(arg) {
            if let Some(o) = &self.open {
                return Ok(o.out_shape.clone());
            }
        }
        match self.by_name.get(&self.resolve(&arg.name)) {
            Some(&v) if !arg.name.is_empty() => Ok(self.values[v].shape.clone()),
            _ => static_shape(arg, node),
        }
    }

    pub(super) fn is_open_output(&self, arg: &Argument) -> bool {
        if arg.name.is_empty() {
            return false;
        }
        let name = self.resolve(&arg.name);
        self.open.as_ref().is_some_and(|o| o.out_name == name)
    }

    /// Binds value `v` as a graph input of the open task, declared with `shape` (the value's
    /// own or a view of it with as many elements).
    pub(super) fn bind(&mut self, v: ValueId, shape: &[usize]) -> TensorRef {
        let weight = matches!(self.values[v].kind, ValueKind::Weight(_));
        let open = self.open.as_mut().expect("bind is called with a task open");
        if let Some(&t) = open.refs.get(&(v, shape.to_vec())) {
            return t;
        }
        let name = format!("x{}", open.ext.len());
        let t = if weight {
            open.b.weight(&name, shape, DType::F32)
        } else {
            open.b.input(&name, shape, DType::F32)
        };
        open.ext.push(v);
        open.refs.insert((v, shape.to_vec()), t);
        t
    }

    /// The tensor of `arg` in the open task: its current output, or a bound input.
    pub(super) fn tensor(&mut self, arg: &Argument, node: &str) -> Result<TensorRef, ImportError> {
        if self.is_open_output(arg) {
            return Ok(self.open.as_ref().map(|o| o.out).expect("checked open"));
        }
        let v = self.value(arg, node)?;
        let shape = self.values[v].shape.clone();
        // An operand of an op that continues a task computed in a view (a 1x1 convolution over
        // flattened pixels) is read in the same view.
        let shape = self.task_view(&shape).unwrap_or(shape);
        Ok(self.bind(v, &shape))
    }

    /// `shape` (which broadcasts into the open task's ONNX shape) in the view harl computes the
    /// task in, where that view merges runs of the ONNX axes; `None` where the task has no
    /// such view or `shape` cannot follow it (it varies along only part of a merged run).
    pub(super) fn task_view(&self, shape: &[usize]) -> Option<Vec<usize>> {
        let open = self.open.as_ref().filter(|o| o.stages > 0)?;
        let harl = open.b.shape(open.out);
        let onnx = &open.out_shape;
        if harl == onnx.as_slice() || !broadcasts_into(shape, onnx) {
            return None;
        }
        // `shape` aligned on the right to the ONNX rank.
        let mut s = vec![1; onnx.len() - shape.len()];
        s.extend_from_slice(shape);
        let mut out = Vec::with_capacity(harl.len());
        let mut axis = 0;
        for &h in &harl {
            let start = axis;
            let mut n = 1usize;
            while n < h || (h == 1 && axis == start) {
                n = n.checked_mul(*onnx.get(axis)?)?;
                axis += 1;
            }
            if n != h {
                return None;
            }
            let run = (start..axis).map(|a| (s[a], onnx[a]));
            if run.clone().all(|(x, o)| x == o) {
                out.push(h);
            } else if run.clone().all(|(x, _)| x == 1) {
                out.push(1);
            } else {
                return None;
            }
        }
        (axis == onnx.len()).then_some(out)
    }

    pub(super) fn tensor_as(
        &mut self,
        arg: &Argument,
        node: &str,
        shape: &[usize],
    ) -> Result<TensorRef, ImportError> {
        let v = self.value(arg, node)?;
        if product(&self.values[v].shape) != product(shape) {
            return Err(node_err(
                node,
                format!("cannot view `{}` as {shape:?}", arg.name),
            ));
        }
        Ok(self.bind(v, shape))
    }

    pub(super) fn operand(&mut self, arg: &Argument, node: &str) -> Result<Operand, ImportError> {
        if !self.is_open_output(arg) && (arg.is_static() || arg.is_constant()) {
            let data = f32_data(arg, node)?;
            if data.len() == 1 {
                return Ok(Operand::Scalar(f64::from(data[0])));
            }
        }
        Ok(Operand::Tensor(self.tensor(arg, node)?))
    }

    /// Starts a task with `node` as its first op.
    pub(super) fn start(&mut self, node: &str) -> Result<(), ImportError> {
        self.close()?;
        self.open = Some(Open {
            b: GraphBuilder::new(),
            ext: Vec::new(),
            refs: HashMap::new(),
            out: TensorRef::Input(0),
            out_name: String::new(),
            out_shape: Vec::new(),
            nodes: vec![node.to_string()],
            stages: 0,
        });
        Ok(())
    }

    /// Records `t` as the open task's output for ONNX tensor `out`.
    pub(super) fn finish_node(
        &mut self,
        node: &str,
        t: TensorRef,
        out: &Argument,
    ) -> Result<(), ImportError> {
        self.finish_node_as(node, t, out, None)
    }

    /// [`Self::finish_node`] where the value's shape is `shape` (a view of harl's output:
    /// a matrix product over flattened rows), or onnx-ir's, or else harl's.
    pub(super) fn finish_node_as(
        &mut self,
        node: &str,
        t: TensorRef,
        out: &Argument,
        shape: Option<Vec<usize>>,
    ) -> Result<(), ImportError> {
        let name = self.resolve(&out.name);
        let open = self.open.as_mut().expect("a node finishes in an open task");
        let got = open.b.shape(t);
        // Without onnx-ir's shape, an op that continues the task keeps the task's shape (harl's
        // may be a view of it: a batched product over flattened batches).
        let kept = (open.stages > 0 && product(&open.out_shape) == product(&got))
            .then(|| open.out_shape.clone());
        let shape = match shape {
            Some(s) => s,
            None => static_shape(out, node)
                .ok()
                .or(kept)
                .unwrap_or_else(|| got.clone()),
        };
        if product(&got) != product(&shape) {
            return Err(node_err(
                node,
                format!("harl computed {got:?}, ONNX infers {shape:?}"),
            ));
        }
        open.out = t;
        open.out_name = name;
        open.out_shape = shape;
        open.stages += 1;
        if open.nodes.last().map(String::as_str) != Some(node) {
            open.nodes.push(node.to_string());
        }
        Ok(())
    }

    /// Ends the open task: its graph becomes a task (or a call of an identical one).
    pub(super) fn close(&mut self) -> Result<(), ImportError> {
        let Some(open) = self.open.take() else {
            return Ok(());
        };
        let first = open.nodes.first().cloned().unwrap_or_default();
        let graph = open.b.finish().map_err(|source| ImportError::Graph {
            node: first.clone(),
            source: Box::new(source),
        })?;
        let key = graph.workload_key();
        let task = match self.task_of.get(&key) {
            Some(&t) => {
                self.tasks[t].weight += 1;
                t
            }
            None => {
                self.tasks.push(Task {
                    name: open.nodes.join("+"),
                    graph,
                    weight: 1,
                });
                self.task_of.insert(key, self.tasks.len() - 1);
                self.tasks.len() - 1
            }
        };
        let output = self.add_value(&open.out_name, open.out_shape, ValueKind::Computed);
        self.calls.push(Call {
            task,
            inputs: open.ext,
            output,
            nodes: open.nodes,
        });
        Ok(())
    }

    pub(super) fn open_mut(&mut self) -> &mut Open {
        self.open.as_mut().expect("an op builds into an open task")
    }

    pub(super) fn current(&self) -> String {
        self.open
            .as_ref()
            .and_then(|o| o.nodes.last().cloned())
            .unwrap_or_default()
    }

    pub(super) fn fresh(&mut self, base: &str) -> String {
        let o = self.open_mut();
        format!("{base}{}", o.stages)
    }

    /// A view: the output is the input's data under the output's shape.
    pub(super) fn view(
        &mut self,
        node: &str,
        x: &Argument,
        out: &Argument,
        shape: Option<Vec<usize>>,
    ) -> Result<(), ImportError> {
        // A view of the open task's output needs that output as a value first.
        if self.is_open_output(x) {
            self.close()?;
        }
        let v = self.value(x, node)?;
        let shape = match shape {
            Some(s) => s,
            None => static_shape(out, node)?,
        };
        if product(&shape) != product(&self.values[v].shape) {
            return Err(node_err(node, "the view changes the element count"));
        }
        let name = self.resolve(&out.name);
        self.add_value(&name, shape, ValueKind::View(v));
        Ok(())
    }

    /// Whether an elementwise node reading `x` (and `others`) continues the open task: it
    /// reads the task's output, the only reader of it, and the others broadcast into its
    /// shape (so the output keeps it).
    pub(super) fn continues(&self, x: &Argument, others: &[&Argument]) -> bool {
        if x.name.is_empty() {
            return false;
        }
        let name = self.resolve(&x.name);
        let Some(open) = &self.open else {
            return false;
        };
        let viewed = open.b.shape(open.out) != open.out_shape.as_slice();
        open.out_name == name
            && self.uses.get(&name) == Some(&1)
            && others.iter().all(|o| {
                self.shape(o, "").is_ok_and(|s| {
                    broadcasts_into(&s, &open.out_shape)
                        && (!viewed || self.task_view(&s).is_some())
                })
            })
    }

    pub(super) fn elementwise(
        &mut self,
        node: &str,
        x: &Argument,
        out: &Argument,
        build: impl FnOnce(&mut Self, TensorRef) -> Result<TensorRef, ImportError>,
    ) -> Result<(), ImportError> {
        if self.continues(x, &[]) {
            self.open_mut().nodes.push(node.to_string());
        } else {
            self.start(node)?;
        }
        let t = self.tensor(x, node)?;
        let y = build(self, t)?;
        self.finish_node(node, y, out)
    }

    pub(super) fn unary(
        &mut self,
        node: &str,
        x: &Argument,
        out: &Argument,
        f: impl Fn(Expr) -> Expr,
    ) -> Result<(), ImportError> {
        self.elementwise(node, x, out, |cv, t| {
            let name = cv.fresh("map");
            ops::unary(&mut cv.open_mut().b, t, f, &name).map_err(|source| ImportError::Op {
                node: node.to_string(),
                source: Box::new(source),
            })
        })
    }

    pub(super) fn binary(
        &mut self,
        node: &str,
        op: BinaryOp,
        a: &Argument,
        b: &Argument,
        out: &Argument,
    ) -> Result<(), ImportError> {
        // The task continues through whichever side is its output.
        let (first, second, swapped) = if self.continues(b, &[a]) && !self.continues(a, &[b]) {
            (b, a, true)
        } else {
            (a, b, false)
        };
        if self.continues(first, &[second]) {
            self.open_mut().nodes.push(node.to_string());
        } else {
            self.start(node)?;
        }
        let x = self.operand(first, node)?;
        let y = self.operand(second, node)?;
        let (l, r) = if swapped { (y, x) } else { (x, y) };
        let err = |source| ImportError::Op {
            node: node.to_string(),
            source: Box::new(source),
        };
        let t = match (l, r) {
            (Operand::Tensor(l), Operand::Tensor(r)) => {
                ops::broadcast_binary(&mut self.open_mut().b, op, l, r).map_err(err)?
            }
            (Operand::Tensor(l), Operand::Scalar(c)) => {
                let name = self.fresh("map");
                ops::unary(
                    &mut self.open_mut().b,
                    l,
                    |e| e.binary(op, Expr::f32(c as f32)),
                    &name,
                )
                .map_err(err)?
            }
            (Operand::Scalar(c), Operand::Tensor(r)) => {
                let name = self.fresh("map");
                ops::unary(
                    &mut self.open_mut().b,
                    r,
                    |e| Expr::f32(c as f32).binary(op, e),
                    &name,
                )
                .map_err(err)?
            }
            (Operand::Scalar(_), Operand::Scalar(_)) => {
                return Err(node_err(node, "an op of two constants (not folded)"))
            }
        };
        self.finish_node(node, t, out)
    }
}

/// Whether shape `s` broadcasts into `into` (numpy rules, aligned on the right) without
/// growing it.
fn broadcasts_into(s: &[usize], into: &[usize]) -> bool {
    s.len() <= into.len()
        && s.iter()
            .rev()
            .zip(into.iter().rev())
            .all(|(&a, &b)| a == b || a == 1)
}
