//! Fuzz target bodies for harl.
//!
//! Each function takes arbitrary bytes and drives one of harl's entry points for untrusted input
//! through to generated Rust:
//!
//! - [`dsl`]: a `#[harl::kernel]` item (as the proc macro and `build.rs`'s crate scan see it) →
//!   te graph → default schedule → lowering → codegen, plus the reference interpreter on zero
//!   inputs when the graph is small;
//! - [`cache_line`]: one tuning-cache line (a record possibly shipped in someone else's crate
//!   release) → parse and validate → lowering and codegen of its schedule on a few graphs;
//! - [`steps`]: a structure-aware list of schedule steps ([`arbitrary`]) on one of the op
//!   library's graphs → lowering → codegen;
//! - [`onnx`]: an ONNX model file (as `Builder::onnx` reads it) → import into tasks → each
//!   task's default schedule lowered and emitted, and the reference run on zeros when the
//!   network is small.
//!
//! None of them may panic, hang or use unbounded memory on any input: a panic (or an abort,
//! a stack overflow, a timeout, an out-of-memory) found by the fuzzer is a bug in harl. The
//! `fuzz/` cargo-fuzz project calls these; `tests/regressions.rs` replays the saved corpus
//! under `regressions/` on stable.

#![warn(missing_docs)]

mod graphs;
pub mod step_input;

use harl_build::codegen::{emit_module, KernelMeta, Variant, VariantProgram};
use harl_build::default_schedule::{default_schedule, CpuTarget};
use harl_build::lower::lower;
use harl_build::schedule::Schedule;
use harl_te::Graph;

pub use step_input::StepsInput;

/// Inputs longer than this are ignored. The fuzzer runs with `-max_len=4096`; the cap keeps a
/// stray large file in a corpus directory from making a replay slow.
pub const MAX_INPUT_BYTES: usize = 64 << 10;

/// The reference interpreter runs only on graphs whose total work (elements of every stage
/// times its reduction's extent) is at most this, so one execution stays in the microseconds.
const MAX_INTERP_WORK: usize = 1 << 14;

/// DSL target: `data` as UTF-8 is one Rust function item, normally carrying a
/// `#[harl::kernel(...)]` attribute whose arguments bind the sizes (without one the arguments
/// are empty, as for a bare `#[harl::kernel]`). A kernel that parses is lowered with its default
/// schedule (as `Builder` does with no tuning record) and emitted; when its graph is small, the
/// interpreter also runs it on zero inputs.
pub fn dsl(data: &[u8]) {
    if data.len() > MAX_INPUT_BYTES {
        return;
    }
    let Ok(src) = std::str::from_utf8(data) else {
        return;
    };
    // The build script's path: the crate scan, with its own parser limits (per item, so a
    // file of several items may keep some that the whole text's limits below would refuse).
    let mut scanned = Vec::new();
    harl_build::scan::scan_source(src, &mut scanned);
    // The macro's path: the token limits first, then syn (which recurses per group and
    // operator, so the order matters).
    let Ok(tokens) = src.parse::<proc_macro2::TokenStream>() else {
        return;
    };
    if harl_te::dsl::check_token_limits(&tokens).is_err() {
        return;
    }
    let Ok(item) = syn::parse2::<syn::ItemFn>(tokens) else {
        return;
    };
    // The same argument extraction as harl-build's crate scan.
    let args = item
        .attrs
        .iter()
        .find(|a| harl_te::dsl::is_kernel_attr(a))
        .and_then(|a| match &a.meta {
            syn::Meta::List(l) => Some(l.tokens.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let Ok(decl) = harl_te::dsl::parse_kernel(args, &item) else {
        return;
    };
    let meta = KernelMeta {
        name: decl.name.clone(),
        params: decl.params.iter().map(|p| p.name.clone()).collect(),
        output: decl.output_name(),
    };
    let graph = &decl.graph;
    let schedule = default_schedule(graph, &CpuTarget::portable());
    // Like `Builder`: a default schedule that does not lower falls back to the plain nest.
    if lower_and_emit(graph, &schedule, &meta, data.len()).is_err() {
        let _ = lower_and_emit(graph, &Schedule::naive(), &meta, data.len());
    }
    interpret_if_small(graph);
}

/// ONNX target: `data` is an ONNX model's bytes. The import gives a network or a typed error
/// (never a panic: onnx-ir's own panics are caught inside `import_bytes`); each task of a
/// network is lowered with its default schedule and emitted, and a small network runs through
/// the interpreter on a zero input.
pub fn onnx(data: &[u8]) {
    if data.len() > MAX_INPUT_BYTES {
        return;
    }
    // onnx-ir panics on some malformed files; `import_bytes` catches that and returns an
    // error. libFuzzer's panic hook would abort on it first, so the hook is silenced for the
    // parse only: a panic in harl's own conversion still unwinds out of the import and out of
    // this target, which libFuzzer reports.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let parsed = std::panic::catch_unwind(|| harl_te::onnx::import_bytes(data));
    std::panic::set_hook(hook);
    let net = match parsed {
        Ok(Ok(net)) => net,
        Ok(Err(_)) => return,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    for (t, task) in net.tasks.iter().enumerate() {
        let graph = &task.graph;
        let meta = graphs::meta(&format!("t{t}"), graph);
        let schedule = default_schedule(graph, &CpuTarget::portable());
        if lower_and_emit(graph, &schedule, &meta, data.len() + t).is_err() {
            let _ = lower_and_emit(graph, &Schedule::naive(), &meta, data.len() + t);
        }
    }
    let elements = |shape: &[usize]| {
        shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= MAX_INTERP_WORK)
    };
    let small = net
        .tasks
        .iter()
        .all(|t| graph_work(&t.graph).is_some_and(|w| w <= MAX_INTERP_WORK))
        && net
            .inputs
            .iter()
            .all(|&v| elements(&net.values[v].shape).is_some());
    if small {
        let inputs: Vec<Vec<f64>> = net
            .inputs
            .iter()
            .map(|&v| vec![0.0; elements(&net.values[v].shape).unwrap_or(0)])
            .collect();
        let refs: Vec<&[f64]> = inputs.iter().map(Vec::as_slice).collect();
        let _ = net.run_reference(&refs);
    }
}

/// Cache-line target: `data` is one line of a `<isa_class>.jsonl` tuning cache. A line that
/// parses into a record has its schedule lowered (which validates it) against each of a few
/// fixed graphs, and emitted where it lowers. Any record parses and lowers or is rejected with
/// an error; none may panic.
pub fn cache_line(data: &[u8]) {
    if data.len() > MAX_INPUT_BYTES {
        return;
    }
    let Ok(record) = harl_build::cache::parse_record(data) else {
        return;
    };
    for (i, (name, graph)) in graphs::cache_graphs().iter().enumerate() {
        let meta = graphs::meta(name, graph);
        let _ = lower_and_emit(graph, &record.schedule, &meta, data.len() + i);
    }
}

/// Steps target: `data` is decoded with [`arbitrary`] as a [`StepsInput`]: which of the op
/// library's graphs, a base schedule (none, or the graph's default schedule, possibly edited)
/// and a list of steps appended to it. The schedule is lowered and, where it lowers, emitted.
pub fn steps(data: &[u8]) {
    if data.len() > MAX_INPUT_BYTES {
        return;
    }
    // Take-rest decoding, as libfuzzer-sys does for typed targets: the last field (the step
    // list) uses every remaining byte instead of reading a length first.
    let u = arbitrary::Unstructured::new(data);
    let Ok(input) = <StepsInput as arbitrary::Arbitrary>::arbitrary_take_rest(u) else {
        return;
    };
    let all = graphs::step_graphs();
    let (name, graph) = &all[input.graph as usize % all.len()];
    let schedule = input.schedule(graph);
    let _ = lower_and_emit(graph, &schedule, &graphs::meta(name, graph), data.len());
}

/// Lowers `graph` with `schedule` and emits the module for one ISA variant. `Builder` emits all
/// three from (usually) the same program; one per input, picked by `pick`, triples the
/// executions per second and still covers each variant's codegen across the corpus. The
/// emitted text is not compiled: codegen's own tests do that, at seconds per kernel.
fn lower_and_emit(
    graph: &Graph,
    schedule: &Schedule,
    meta: &KernelMeta,
    pick: usize,
) -> Result<(), ()> {
    let program = lower(graph, schedule).map_err(|_| ())?;
    let variants = [VariantProgram {
        variant: Variant::ALL[pick % Variant::ALL.len()],
        program,
        source: "fuzz".into(),
    }];
    let code = emit_module(graph, &variants, meta);
    // Every kernel's module names its workload key: an empty or truncated emission would be a
    // codegen failure reported as success.
    assert!(
        code.contains("pub const WORKLOAD_KEY"),
        "emit_module returned no module for kernel `{}`",
        meta.name
    );
    Ok(())
}

/// Runs the reference interpreter on zero inputs when the graph is small. A graph the DSL
/// accepted must evaluate, except for an integer division by zero, which the DSL lets through
/// by design. (A guarded load that leaves its tensor reads zero, in the interpreter as in the
/// emitted code.) Anything else (a graph that does not validate, inputs that do not match it)
/// is a bug.
fn interpret_if_small(graph: &Graph) {
    let Some(work) = graph_work(graph) else {
        return;
    };
    if work > MAX_INTERP_WORK {
        return;
    }
    let zeros: Vec<Vec<f64>> = graph
        .inputs
        .iter()
        .map(|p| vec![0.0; p.shape.iter().product()])
        .collect();
    let refs: Vec<&[f64]> = zeros.iter().map(Vec::as_slice).collect();
    match harl_te::interp::run(graph, &refs) {
        Ok(_) | Err(harl_te::interp::InterpError::DivByZero(_)) => {}
        Err(e) => panic!("the interpreter rejected a graph the DSL accepted: {e}"),
    }
}

/// Elements the interpreter computes (every stage's elements times its reduction extent, plus
/// the inputs it allocates), or `None` if that overflows.
fn graph_work(graph: &Graph) -> Option<usize> {
    let product = |dims: &[usize]| {
        dims.iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d.max(1)))
    };
    let mut work = 0usize;
    for p in &graph.inputs {
        work = work.checked_add(product(&p.shape)?)?;
    }
    for stage in &graph.stages {
        let reduce = stage
            .reduce
            .as_ref()
            .map_or(Some(1), |r| product(&r.extents))?;
        work = work.checked_add(product(&stage.shape)?.checked_mul(reduce)?)?;
    }
    Some(work)
}
