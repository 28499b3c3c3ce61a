//! ONNX import (feature `onnx`): a model file becomes a [`Network`] of harl kernels.
//!
//! [`import`] parses the file with `onnx-ir` (burn's ONNX parser: every opset, static shape
//! inference, constant lifting) and converts its nodes into harl tensor expressions, grouped
//! into **tasks**: an anchor op (convolution, matrix product, pooling, softmax, layer norm,
//! transpose) with the elementwise ops that follow it on its output alone (bias, batch norm,
//! residual add, ReLU / ReLU6, GELU, scaling) fused into one kernel graph. Batch normalisation
//! after a convolution is folded into its weights. Reshapes and flattens are views (no
//! kernel). Identical kernels are one task whose weight counts its calls, as a task scheduler
//! needs. Weights (the model's initializers) are graph inputs marked constant, their data kept
//! in the network.
//!
//! An op outside the supported set is an [`ImportError::Unsupported`] naming the op, the node
//! and the model's opset; nothing panics on a malformed file.
//!
//! [`Network::run_reference`] runs every call through the reference interpreter: the check
//! that an import computes what onnxruntime computes (harl-te's tests, on models made by
//! `tests/onnx/make_models.py`).

mod convert;
mod nodes;
mod opset;

use crate::graph::Graph;
use crate::interp;
use std::collections::HashMap;
use std::path::Path;

pub use nodes::SUPPORTED_OPS;

/// Index of a value (a tensor) of a [`Network`].
pub type ValueId = usize;

/// A tensor of the network.
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    /// The ONNX name of the tensor.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Where its data comes from.
    pub kind: ValueKind,
}

/// Where a value's data comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum ValueKind {
    /// A network input.
    Input,
    /// A weight: an initializer (or one folded from several), row-major f32.
    Weight(Vec<f32>),
    /// The output of a call.
    Computed,
    /// The same data as another value under another shape (Reshape, Flatten).
    View(ValueId),
}

/// One distinct kernel of the network.
#[derive(Clone, Debug)]
pub struct Task {
    /// A readable name: the ops of its first call.
    pub name: String,
    /// The kernel; its inputs are the call's inputs, in order; weights are constant inputs.
    pub graph: Graph,
    /// How many calls run it.
    pub weight: usize,
}

/// One kernel call of the network, in execution order.
#[derive(Clone, Debug)]
pub struct Call {
    /// The task it runs.
    pub task: usize,
    /// The values bound to the task graph's inputs, in order.
    pub inputs: Vec<ValueId>,
    /// The value its output is.
    pub output: ValueId,
    /// The ONNX nodes it computes.
    pub nodes: Vec<String>,
}

/// An imported model: values, distinct tasks and the calls that run them.
#[derive(Clone, Debug)]
pub struct Network {
    /// Every tensor.
    pub values: Vec<Value>,
    /// The network's inputs.
    pub inputs: Vec<ValueId>,
    /// The network's output.
    pub output: ValueId,
    /// The distinct kernels.
    pub tasks: Vec<Task>,
    /// The calls, in order.
    pub calls: Vec<Call>,
}

/// Why a model could not be imported or run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ImportError {
    /// The file could not be read or parsed as ONNX.
    #[error("cannot parse the ONNX model: {0}")]
    Parse(String),
    /// An op harl does not import (yet).
    #[error("unsupported ONNX op `{op}` (node `{node}`, opset {opset}); supported: {}", SUPPORTED_OPS.join(", "))]
    Unsupported {
        /// The op type.
        op: String,
        /// The node's name.
        node: String,
        /// The model's default-domain opset.
        opset: usize,
    },
    /// A node uses a form of a supported op that harl does not import (a dynamic shape, an
    /// attribute value), or its inputs do not fit.
    #[error("node `{node}`: {why}")]
    Node {
        /// The node's name.
        node: String,
        /// What is wrong.
        why: String,
    },
    /// Building the kernel of a node failed.
    #[error("node `{node}`: {source}")]
    Op {
        /// The node's name.
        node: String,
        /// The op library's error.
        source: Box<crate::ops::OpError>,
    },
    /// A task graph failed validation.
    #[error("task of node `{node}`: {source}")]
    Graph {
        /// The node that started the task.
        node: String,
        /// The graph's error.
        source: Box<crate::graph::GraphError>,
    },
    /// Running the network's reference failed.
    #[error("reference run: {0}")]
    Run(String),
}

/// Imports the ONNX model at `path`.
pub fn import(path: impl AsRef<Path>) -> Result<Network, ImportError> {
    let bytes = std::fs::read(path.as_ref())
        .map_err(|e| ImportError::Parse(format!("{}: {e}", path.as_ref().display())))?;
    import_bytes(&bytes)
}

/// Imports an ONNX model from its bytes.
pub fn import_bytes(bytes: &[u8]) -> Result<Network, ImportError> {
    let opset = opset::default_opset(bytes);
    // onnx-ir panics on some malformed inputs; a bad file must be an error, never a crash.
    let parsed = std::panic::catch_unwind(|| {
        onnx_ir::OnnxGraphBuilder::new()
            .simplify(false)
            .parse_bytes(bytes)
    })
    .map_err(|_| ImportError::Parse("the parser failed on this file".into()))?
    .map_err(|e| ImportError::Parse(e.to_string()))?;
    convert::convert(&parsed, opset)
}

impl Network {
    /// Runs the network through the reference interpreter (f64) on `inputs` (one slice per
    /// network input, row-major); returns the output.
    pub fn run_reference(&self, inputs: &[&[f64]]) -> Result<Vec<f64>, ImportError> {
        if inputs.len() != self.inputs.len() {
            return Err(ImportError::Run(format!(
                "{} inputs given, the network has {}",
                inputs.len(),
                self.inputs.len()
            )));
        }
        let mut data: HashMap<ValueId, Vec<f64>> = HashMap::new();
        for (&v, x) in self.inputs.iter().zip(inputs) {
            data.insert(v, x.to_vec());
        }
        for call in &self.calls {
            let task = self
                .tasks
                .get(call.task)
                .ok_or_else(|| ImportError::Run(format!("no task {}", call.task)))?;
            let args: Vec<Vec<f64>> = call
                .inputs
                .iter()
                .map(|&v| self.data_of(v, &data))
                .collect::<Result<_, _>>()?;
            let refs: Vec<&[f64]> = args.iter().map(Vec::as_slice).collect();
            let out = interp::run(&task.graph, &refs)
                .map_err(|e| ImportError::Run(format!("task `{}`: {e}", task.name)))?;
            data.insert(call.output, out);
        }
        self.data_of(self.output, &data)
    }

    fn data_of(
        &self,
        mut v: ValueId,
        data: &HashMap<ValueId, Vec<f64>>,
    ) -> Result<Vec<f64>, ImportError> {
        // Views chain to the value that holds the data (each points to an earlier value).
        for _ in 0..=self.values.len() {
            let value = self
                .values
                .get(v)
                .ok_or_else(|| ImportError::Run(format!("no value {v}")))?;
            match &value.kind {
                ValueKind::View(of) => v = *of,
                ValueKind::Weight(w) => return Ok(w.iter().map(|&x| f64::from(x)).collect()),
                ValueKind::Input | ValueKind::Computed => {
                    return data.get(&v).cloned().ok_or_else(|| {
                        ImportError::Run(format!("`{}` is not computed", value.name))
                    })
                }
            }
        }
        Err(ImportError::Run("a cycle of views".into()))
    }

    /// Calls per task, summed: the network's kernel launches per run.
    pub fn total_calls(&self) -> usize {
        self.tasks.iter().map(|t| t.weight).sum()
    }
}
