//! Networks from ONNX models (`Builder::onnx`, feature `onnx`): each task of the imported
//! network becomes a kernel like any registered one (scheduled from the cache, tuned by
//! `cargo harl tune`), and a module with a `Model` runs the network's calls in order.
//!
//! The weights are embedded in the binary (`include_bytes!` of a file written next to the
//! generated code) and prepared once by `Model::new`: each call with weights keeps its
//! kernel's `Prepared`. Intermediate tensors are allocated once, in `new`, and reused by
//! every `run`.

use harl_te::onnx::{Network, ValueId, ValueKind};
use std::collections::HashMap;
use std::fmt::Write;

/// The kernel name of task `t` of model `model`.
pub(super) fn task_name(model: &str, t: usize) -> String {
    format!("{model}_t{t}")
}

/// Where a value's data lives when the model runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Storage {
    /// The `input` argument of `run`.
    Input,
    /// A weight, by its value.
    Weight(ValueId),
    /// Intermediate buffer `b[i]`.
    Buffer(usize),
}

/// The value that holds `v`'s data (views resolved); `None` on a malformed network.
fn root(net: &Network, mut v: ValueId) -> Option<ValueId> {
    for _ in 0..=net.values.len() {
        match net.values.get(v)?.kind {
            ValueKind::View(of) => v = of,
            _ => return Some(v),
        }
    }
    None
}

fn elements(shape: &[usize]) -> usize {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .unwrap_or(usize::MAX)
}

/// The weights file (every weight's f32 values, little-endian, one after another) and each
/// weight's (offset in bytes, elements).
pub(super) fn weights_blob(net: &Network) -> (Vec<u8>, HashMap<ValueId, (usize, usize)>) {
    let mut blob = Vec::new();
    let mut at = HashMap::new();
    for (v, value) in net.values.iter().enumerate() {
        if let ValueKind::Weight(w) = &value.kind {
            at.insert(v, (blob.len(), w.len()));
            for x in w {
                blob.extend_from_slice(&x.to_le_bytes());
            }
        }
    }
    (blob, at)
}

/// The module of model `name`: `Model::new()` and `Model::run(input, output)`. Task kernels
/// are `super::{name}_t{i}`; the weights file is `weights_file` in the generated directory.
pub(super) fn emit_model(
    name: &str,
    net: &Network,
    weights: &HashMap<ValueId, (usize, usize)>,
    weights_file: &str,
) -> Result<String, String> {
    let input = *net.inputs.first().ok_or("the network has no input")?;
    if net.inputs.len() != 1 {
        return Err(format!(
            "{} network inputs; a model has one",
            net.inputs.len()
        ));
    }
    let input_shape = net.values[input].shape.clone();
    let output_shape = net
        .values
        .get(net.output)
        .ok_or("no output value")?
        .shape
        .clone();
    // Storage of every value: one buffer per computed value.
    let mut storage: HashMap<ValueId, Storage> = HashMap::new();
    let mut buffers: Vec<usize> = Vec::new();
    for v in 0..net.values.len() {
        let r = root(net, v).ok_or("a cycle of views")?;
        let s = match &net.values[r].kind {
            ValueKind::Input if r == input => Storage::Input,
            ValueKind::Input => return Err("a second network input".into()),
            ValueKind::Weight(_) => Storage::Weight(r),
            ValueKind::Computed => match storage.get(&r) {
                Some(s) => *s,
                None => {
                    buffers.push(elements(&net.values[r].shape));
                    Storage::Buffer(buffers.len() - 1)
                }
            },
            ValueKind::View(_) => return Err("a view of a view was not resolved".into()),
        };
        storage.insert(r, s);
        storage.insert(v, s);
    }
    let weight_expr = |w: ValueId| -> Result<String, String> {
        let (off, len) = weights
            .get(&w)
            .ok_or_else(|| format!("weight {w} is not in the weights file"))?;
        Ok(format!("weight({off}, {len})"))
    };
    let mut fields = String::new();
    let mut init = String::new();
    let mut run = String::new();
    // Weights a call reads as plain arguments (views of weights): kept as vectors.
    let mut kept_weights: Vec<ValueId> = Vec::new();
    for (c, call) in net.calls.iter().enumerate() {
        let task = net.tasks.get(call.task).ok_or("a call of a missing task")?;
        let kernel = task_name(name, call.task);
        let constant: Vec<bool> = task.graph.inputs.iter().map(|p| p.constant).collect();
        if constant.len() != call.inputs.len() {
            return Err(format!("call {c} binds the wrong number of inputs"));
        }
        let mut run_args = Vec::new();
        let mut prep_args = Vec::new();
        for (&v, &is_weight) in call.inputs.iter().zip(&constant) {
            let s = *storage.get(&v).ok_or("a value without storage")?;
            if is_weight {
                let Storage::Weight(w) = s else {
                    return Err(format!("call {c}: a constant input is not a weight"));
                };
                prep_args.push(weight_expr(w)?);
                continue;
            }
            run_args.push(match s {
                Storage::Input => "input".to_string(),
                Storage::Buffer(b) => format!("&self.b[{b}]"),
                Storage::Weight(w) => {
                    if !kept_weights.contains(&w) {
                        kept_weights.push(w);
                    }
                    format!("&self.w{w}")
                }
            });
        }
        let Storage::Buffer(out) = *storage
            .get(&call.output)
            .ok_or("an output without storage")?
        else {
            return Err(format!("call {c} writes a non-buffer"));
        };
        run_args.push("&mut __out".to_string());
        let _ = writeln!(run, "            // {}: {}", kernel, call.nodes.join(", "));
        let invoke = if prep_args.is_empty() {
            format!("super::{kernel}::run({})", run_args.join(", "))
        } else {
            let _ = writeln!(fields, "        p{c}: super::{kernel}::Prepared,");
            let _ = writeln!(
                init,
                "            let p{c} = super::{kernel}::prepare({})?;",
                prep_args
                    .iter()
                    .map(|a| format!("&{a}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            format!("self.p{c}.run({})", run_args.join(", "))
        };
        let _ = writeln!(
            run,
            "            {{\n                let mut __out = ::core::mem::take(&mut self.b[{out}]);\n                let r = {invoke};\n                self.b[{out}] = __out;\n                r?;\n            }}"
        );
    }
    for &w in &kept_weights {
        let _ = writeln!(fields, "        w{w}: ::std::vec::Vec<f32>,");
        let _ = writeln!(init, "            let w{w} = {};", weight_expr(w)?);
    }
    let field_names: Vec<String> = net
        .calls
        .iter()
        .enumerate()
        .filter(|(_, call)| {
            net.tasks
                .get(call.task)
                .is_some_and(|t| t.graph.inputs.iter().any(|p| p.constant))
        })
        .map(|(c, _)| format!("p{c}"))
        .chain(kept_weights.iter().map(|w| format!("w{w}")))
        .collect();
    let Storage::Buffer(out_buf) = *storage.get(&net.output).ok_or("no output storage")? else {
        return Err("the output is not computed".into());
    };
    let input_len = elements(&input_shape);
    let output_len = elements(&output_shape);
    let bufs: Vec<String> = buffers
        .iter()
        .map(|n| format!("::std::vec![0.0f32; {n}]"))
        .collect();
    Ok(format!(
        r#"/// Network `{name}`, imported from ONNX: {calls} kernel calls of {tasks} distinct tasks.
#[allow(warnings, clippy::all, unsafe_code, missing_docs)]
pub mod {name} {{
    static WEIGHTS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/harl/{weights_file}"));

    fn weight(offset: usize, len: usize) -> ::std::vec::Vec<f32> {{
        WEIGHTS[offset..offset + 4 * len]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }}

    /// The input's shape.
    pub const INPUT_SHAPE: &[usize] = &{input_shape:?};
    /// The output's shape.
    pub const OUTPUT_SHAPE: &[usize] = &{output_shape:?};

    /// The network with its weights prepared and its intermediate tensors allocated.
    pub struct Model {{
{fields}        b: ::std::vec::Vec<::std::vec::Vec<f32>>,
    }}

    impl Model {{
        /// Prepares every kernel's weights (embedded in the binary) and allocates the
        /// intermediate tensors.
        pub fn new() -> ::core::result::Result<Model, ::harl::KernelError> {{
{init}            Ok(Model {{ {field_list}b: ::std::vec![{bufs}] }})
        }}

        /// Runs the network on `input` (row-major, [`INPUT_SHAPE`]) into `output`
        /// ([`OUTPUT_SHAPE`]).
        pub fn run(&mut self, input: &[f32], output: &mut [f32]) -> ::core::result::Result<(), ::harl::KernelError> {{
            if input.len() != {input_len} {{
                return Err(::harl::KernelError::Length {{ kernel: "{name}", arg: "input", got: input.len(), want: {input_len}, shape: "{input_shape:?}" }});
            }}
            if output.len() != {output_len} {{
                return Err(::harl::KernelError::Length {{ kernel: "{name}", arg: "output", got: output.len(), want: {output_len}, shape: "{output_shape:?}" }});
            }}
{run}            output.copy_from_slice(&self.b[{out_buf}]);
            Ok(())
        }}
    }}
}}
"#,
        calls = net.calls.len(),
        tasks = net.tasks.len(),
        field_list = field_names
            .iter()
            .map(|f| format!("{f}, "))
            .collect::<String>(),
        bufs = bufs.join(", "),
    ))
}
