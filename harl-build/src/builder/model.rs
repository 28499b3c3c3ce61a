//! Networks from ONNX models (`Builder::onnx`, feature `onnx`): each task of the imported
//! network becomes a kernel like any registered one (scheduled from the cache, tuned by
//! `cargo harl tune`), and a module with a `Model` runs the network's calls in order.
//!
//! The weights go in a file written next to the generated code (with a header the runtime
//! checks, `harl::weights`), embedded in the binary (`include_bytes!`) or read at run time
//! ([`super::ModelWeights`]), and are prepared once when the `Model` is made: each call with
//! weights keeps its kernel's `Prepared`. Intermediate tensors are allocated once, then, and
//! reused by every `run`.

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

/// A buffer for every computed value, reused once the values in it are read for the last
/// time (as onnxruntime's memory planner does): the network's working set then stays close to
/// the cache instead of growing with its depth (MobileNet-V2's 112x112 pointwise convolution
/// ran 2.6x slower in the network than alone, its output written past the cache). Returns
/// each computed value's buffer and the buffers' sizes (the largest value each holds).
fn plan_buffers(net: &Network) -> Result<(HashMap<ValueId, usize>, Vec<usize>), String> {
    let computed = |v: ValueId| -> Option<ValueId> {
        let r = root(net, v)?;
        matches!(net.values[r].kind, ValueKind::Computed).then_some(r)
    };
    // The last call that reads each computed value; the network's output is read at the end.
    let mut last_read: HashMap<ValueId, usize> = HashMap::new();
    for (c, call) in net.calls.iter().enumerate() {
        for &v in &call.inputs {
            if let Some(r) = computed(v) {
                last_read.insert(r, c);
            }
        }
    }
    if let Some(r) = computed(net.output) {
        last_read.insert(r, usize::MAX);
    }
    let mut buffer_of = HashMap::new();
    let mut sizes: Vec<usize> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    for (c, call) in net.calls.iter().enumerate() {
        let r = computed(call.output).ok_or("a call writes a value that is not computed")?;
        let n = elements(&net.values[r].shape);
        // The smallest free buffer that holds it, else the largest free one (grown), else a
        // new one.
        let fit = free
            .iter()
            .enumerate()
            .filter(|(_, &b)| sizes[b] >= n)
            .min_by_key(|(_, &b)| sizes[b])
            .or_else(|| free.iter().enumerate().max_by_key(|(_, &b)| sizes[b]))
            .map(|(i, _)| i);
        let b = match fit {
            Some(i) => free.swap_remove(i),
            None => {
                sizes.push(0);
                sizes.len() - 1
            }
        };
        sizes[b] = sizes[b].max(n);
        buffer_of.insert(r, b);
        // Buffers whose values this call read for the last time (and a value nothing reads)
        // are free for the calls after it; never the one it writes.
        let mut done: Vec<ValueId> = call.inputs.iter().filter_map(|&v| computed(v)).collect();
        done.push(r);
        done.sort_unstable();
        done.dedup();
        for d in done {
            if last_read.get(&d).copied().unwrap_or(c) == c {
                if let Some(&db) = buffer_of.get(&d) {
                    if !free.contains(&db) {
                        free.push(db);
                    }
                }
            }
        }
    }
    Ok((buffer_of, sizes))
}

/// A model's weights file: `bytes` is what the build writes (header and payload, the format
/// `harl::weights` reads), `offsets` each weight's (byte offset in the payload, elements).
pub(super) struct WeightsFile {
    pub(super) bytes: Vec<u8>,
    offsets: HashMap<ValueId, (usize, usize)>,
    fingerprint: u64,
    payload_len: usize,
}

/// The first bytes of a weights file (`harl::weights::MAGIC`).
const MAGIC: &[u8; 8] = b"HARLWTS1";
/// Bytes before the payload: magic, fingerprint, payload length (`harl::weights::HEADER_LEN`).
const HEADER_LEN: usize = 24;

/// `harl::weights::fingerprint`, the runtime's check of the file: the two crates assert the
/// same known answers.
fn fingerprint(payload: &[u8]) -> u64 {
    let step = |h: u64, w: u64| (h ^ w).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(29);
    let words = payload.chunks_exact(8);
    let tail = words.remainder();
    let h = words.fold(0xcbf2_9ce4_8422_2325u64 ^ payload.len() as u64, |h, w| {
        step(h, w.iter().rev().fold(0, |v, &b| (v << 8) | u64::from(b)))
    });
    tail.iter().fold(h, |h, &b| step(h, u64::from(b)))
}

/// The weights file of `net`: every weight's f32 values, little-endian, one after another,
/// behind the header.
pub(super) fn weights_file(net: &Network) -> WeightsFile {
    // The header's fingerprint and length are filled in once the payload is written after it
    // (one buffer: BERT-base's weights are 340 MB).
    let mut bytes = vec![0u8; HEADER_LEN];
    bytes[..MAGIC.len()].copy_from_slice(MAGIC);
    let mut offsets = HashMap::new();
    for (v, value) in net.values.iter().enumerate() {
        if let ValueKind::Weight(w) = &value.kind {
            offsets.insert(v, (bytes.len() - HEADER_LEN, w.len()));
            for x in w {
                bytes.extend_from_slice(&x.to_le_bytes());
            }
        }
    }
    let payload_len = bytes.len() - HEADER_LEN;
    let fingerprint = fingerprint(&bytes[HEADER_LEN..]);
    bytes[8..16].copy_from_slice(&fingerprint.to_le_bytes());
    bytes[16..HEADER_LEN].copy_from_slice(&(payload_len as u64).to_le_bytes());
    WeightsFile {
        bytes,
        offsets,
        fingerprint,
        payload_len,
    }
}

/// The module of model `name`: `Model::new()` (weights embedded, or read from the build's
/// file), `Model::load(path)`, `Model::from_weights(bytes)` and `Model::run(input, output)`.
/// Task kernels are `super::{name}_t{i}`; the weights file is `file_name` in the generated
/// directory.
pub(super) fn emit_model(
    name: &str,
    net: &Network,
    weights: &WeightsFile,
    file_name: &str,
    placement: super::ModelWeights,
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
    let (buffer_of, buffers) = plan_buffers(net)?;
    // Storage of every value (views resolved).
    let mut storage: HashMap<ValueId, Storage> = HashMap::new();
    for v in 0..net.values.len() {
        let r = root(net, v).ok_or("a cycle of views")?;
        let s = match &net.values[r].kind {
            ValueKind::Input if r == input => Storage::Input,
            ValueKind::Input => return Err("a second network input".into()),
            ValueKind::Weight(_) => Storage::Weight(r),
            ValueKind::Computed => match buffer_of.get(&r) {
                Some(&b) => Storage::Buffer(b),
                None => return Err(format!("value {r} is computed by no call")),
            },
            ValueKind::View(_) => return Err("a view of a view was not resolved".into()),
        };
        storage.insert(v, s);
    }
    let len = |v: ValueId| elements(&net.values[v].shape);
    let weight_expr = |w: ValueId| -> Result<String, String> {
        let (off, len) = weights
            .offsets
            .get(&w)
            .ok_or_else(|| format!("weight {w} is not in the weights file"))?;
        Ok(format!("weight(w, {off}, {len})?"))
    };
    let mut fields = String::new();
    let mut field_names: Vec<String> = Vec::new();
    let mut init = String::new();
    let mut run = String::new();
    // The same calls, each timed (`run_timed`), and what each computes (`CALLS`).
    let mut timed = String::new();
    let mut call_names: Vec<String> = Vec::new();
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
                Storage::Buffer(b) => format!("&self.b[{b}][..{}]", len(v)),
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
        run_args.push(format!("&mut __out[..{}]", len(call.output)));
        // Node names come from the model file: quoted (escaped), never raw in the source.
        let _ = writeln!(run, "            // {kernel}: {:?}", call.nodes.join(", "));
        let invoke = if prep_args.is_empty() {
            format!("super::{kernel}::run({})", run_args.join(", "))
        } else {
            field_names.push(format!("p{c}"));
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
        let block = format!(
            "            {{\n                let mut __out = ::core::mem::take(&mut self.b[{out}]);\n                let r = {invoke};\n                self.b[{out}] = __out;\n                r?;\n            }}\n"
        );
        run.push_str(&block);
        timed.push_str(&format!(
            "            let __t = ::std::time::Instant::now();\n{block}            times.push(__t.elapsed().as_secs_f64());\n"
        ));
        call_names.push(format!("{kernel}: {}", call.nodes.join(", ")));
    }
    for &w in &kept_weights {
        field_names.push(format!("w{w}"));
        let _ = writeln!(fields, "        w{w}: ::harl::runtime::AlignedBuf<f32>,");
        let _ = writeln!(
            init,
            "            let w{w} = ::harl::runtime::AlignedBuf::from_slice(&{});",
            weight_expr(w)?
        );
    }
    let Storage::Buffer(out_buf) = *storage.get(&net.output).ok_or("no output storage")? else {
        return Err("the output is not computed".into());
    };
    let input_len = elements(&input_shape);
    let output_len = elements(&output_shape);
    let bufs: Vec<String> = buffers
        .iter()
        .map(|n| format!("::harl::runtime::AlignedBuf::<f32>::filled({n}, 0.0)"))
        .collect();
    Ok(format!(
        r#"/// Network `{name}`, imported from ONNX: {calls} kernel calls of {tasks} distinct tasks.
#[allow(warnings, clippy::all, unsafe_code, missing_docs)]
pub mod {name} {{
    /// The weights file's name.
    pub const WEIGHTS_FILE: &str = "{file_name}";
    /// Where the build wrote the weights file (ship a copy and [`Model::load`] it).
    pub const WEIGHTS_PATH: &str = concat!(env!("OUT_DIR"), "/harl/{file_name}");
    const FINGERPRINT: u64 = {fingerprint:#018x};
    const WEIGHTS_LEN: usize = {payload_len};
{embedded}
    fn check_lengths(input: &[f32], output: &[f32]) -> ::core::result::Result<(), ::harl::KernelError> {{
        if input.len() != {input_len} {{
            return Err(::harl::KernelError::Length {{ kernel: "{name}", arg: "input", got: input.len(), want: {input_len}, shape: "{input_shape:?}" }});
        }}
        if output.len() != {output_len} {{
            return Err(::harl::KernelError::Length {{ kernel: "{name}", arg: "output", got: output.len(), want: {output_len}, shape: "{output_shape:?}" }});
        }}
        Ok(())
    }}

    fn weight(w: &[u8], offset: usize, len: usize) -> ::core::result::Result<::std::vec::Vec<f32>, ::harl::KernelError> {{
        ::harl::weights::floats("{name}", w, offset, len)
    }}

    /// The input's shape.
    pub const INPUT_SHAPE: &[usize] = &{input_shape:?};
    /// The output's shape.
    pub const OUTPUT_SHAPE: &[usize] = &{output_shape:?};

    /// The network with its weights prepared and its intermediate tensors allocated.
    pub struct Model {{
{fields}        b: ::std::vec::Vec<::harl::runtime::AlignedBuf<f32>>,
    }}

    impl Model {{
{new}
        /// [`Model::from_weights`] of the weights file at `path` (a copy of [`WEIGHTS_PATH`]).
        pub fn load(path: impl ::core::convert::AsRef<::std::path::Path>) -> ::core::result::Result<Model, ::harl::KernelError> {{
            Model::from_weights(&::harl::weights::read("{name}", path.as_ref())?)
        }}

        /// Prepares every kernel's weights from `bytes`, a weights file's contents (checked:
        /// a file of another model or build is an error), and allocates the intermediate
        /// tensors.
        pub fn from_weights(bytes: &[u8]) -> ::core::result::Result<Model, ::harl::KernelError> {{
            let w = ::harl::weights::payload("{name}", bytes, FINGERPRINT, WEIGHTS_LEN)?;
{init}            Ok(Model {{ {field_list}b: ::std::vec![{bufs}] }})
        }}

        /// Runs the network on `input` (row-major, [`INPUT_SHAPE`]) into `output`
        /// ([`OUTPUT_SHAPE`]).
        pub fn run(&mut self, input: &[f32], output: &mut [f32]) -> ::core::result::Result<(), ::harl::KernelError> {{
            check_lengths(input, output)?;
{run}            output.copy_from_slice(&self.b[{out_buf}][..{output_len}]);
            Ok(())
        }}

        /// [`Model::run`], returning each call's seconds (in the order of [`CALLS`]).
        pub fn run_timed(&mut self, input: &[f32], output: &mut [f32]) -> ::core::result::Result<::std::vec::Vec<f64>, ::harl::KernelError> {{
            check_lengths(input, output)?;
            let mut times = ::std::vec::Vec::with_capacity(CALLS.len());
{timed}            output.copy_from_slice(&self.b[{out_buf}][..{output_len}]);
            Ok(times)
        }}
    }}

    /// Each kernel call of [`Model::run`]: its kernel and the ONNX nodes it computes.
    pub const CALLS: &[&str] = &{call_names:?};
}}
"#,
        calls = net.calls.len(),
        tasks = net.tasks.len(),
        field_list = field_names
            .iter()
            .map(|f| format!("{f}, "))
            .collect::<String>(),
        bufs = bufs.join(", "),
        fingerprint = weights.fingerprint,
        payload_len = weights.payload_len,
        embedded = match placement {
            super::ModelWeights::Embedded => format!(
                "    static WEIGHTS: &[u8] = include_bytes!(concat!(env!(\"OUT_DIR\"), \"/harl/{file_name}\"));\n"
            ),
            super::ModelWeights::File => String::new(),
        },
        new = match placement {
            super::ModelWeights::Embedded => "        /// The model with the weights embedded in the binary.
        pub fn new() -> ::core::result::Result<Model, ::harl::KernelError> {
            Model::from_weights(WEIGHTS)
        }
",
            super::ModelWeights::File => "        /// The model with the weights file the build wrote ([`WEIGHTS_PATH`], on the build
        /// machine); a shipped binary uses [`Model::load`].
        pub fn new() -> ::core::result::Result<Model, ::harl::KernelError> {
            Model::load(WEIGHTS_PATH)
        }
",
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use harl_te::onnx::{Call, Task, Value};

    /// A one-call network: relu of a 4-vector, the call named `nodes`.
    fn relu_net(nodes: &str) -> Network {
        let mut b = harl_te::GraphBuilder::new();
        let x = b.input("x", &[4], harl_te::DType::F32);
        harl_te::ops::relu(&mut b, x).expect("relu");
        let graph = b.finish().expect("graph");
        let value = |name: &str, kind| Value {
            name: name.into(),
            shape: vec![4],
            kind,
        };
        Network {
            values: vec![
                value("x", ValueKind::Input),
                value("y", ValueKind::Computed),
            ],
            inputs: vec![0],
            output: 1,
            tasks: vec![Task {
                name: "relu".into(),
                graph,
                weight: 1,
            }],
            calls: vec![Call {
                task: 0,
                inputs: vec![0],
                output: 1,
                nodes: vec![nodes.into()],
            }],
        }
    }

    #[test]
    fn node_names_from_the_file_never_reach_the_source_raw() {
        let evil = "a\n}\nfn injected() {}\n//";
        let weights = weights_file(&relu_net(evil));
        let src = emit_model(
            "m",
            &relu_net(evil),
            &weights,
            "m.weights",
            super::super::ModelWeights::Embedded,
        )
        .expect("emits");
        // Quoted and escaped in the comment and in `CALLS`: never a line of its own.
        assert!(!src.contains("\nfn injected"), "{src}");
        assert!(src.contains(r#"a\n}\nfn injected() {}\n//"#), "{src}");
        assert!(
            src.contains("super::m_t0::run(input, &mut __out[..4])"),
            "{src}"
        );
    }

    /// The same answers as `harl::weights`' test (the reader): the two must agree bit for bit.
    #[test]
    fn fingerprint_known_answers() {
        assert_eq!(fingerprint(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fingerprint(b"harl"), 0x1d3b_cc8b_14c0_a5e4);
        assert_eq!(fingerprint(b"harl weights 1.0"), 0x499d_46a9_fd54_9617);
    }

    #[test]
    fn buffers_are_reused_once_their_values_are_read_for_the_last_time() {
        // x -> a -> b -> c -> out: each value read once, by the next call.
        let mut net = relu_net("r");
        net.values = ["x", "a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, n)| Value {
                name: (*n).into(),
                shape: vec![4],
                kind: if i == 0 {
                    ValueKind::Input
                } else {
                    ValueKind::Computed
                },
            })
            .collect();
        net.calls = (0..3)
            .map(|i| Call {
                task: 0,
                inputs: vec![i],
                output: i + 1,
                nodes: vec![format!("r{i}")],
            })
            .collect();
        net.output = 3;
        let (buffer_of, sizes) = plan_buffers(&net).expect("plan");
        // a and c share a buffer (a is dead once b is computed); b has its own.
        assert_eq!(sizes.len(), 2, "{buffer_of:?}");
        assert_eq!(buffer_of[&1], buffer_of[&3]);
        assert_ne!(buffer_of[&1], buffer_of[&2]);
    }
}
