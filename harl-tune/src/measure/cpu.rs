//! The measurer: candidates are compiled as they would ship, run out of process, checked against
//! the reference interpreter, then timed.
//!
//! One batch is one cargo project in [`MeasureConfig::work_dir`]: a bin `worker` that depends on
//! the `harl` facade by path, built with `cargo build --release --offline` (opt-level 3 like a
//! user's release build, no target-cpu flags of its own; the environment's `RUSTFLAGS` and
//! `RUSTC` apply, as they do to the user's build). Each schedule is lowered and emitted by the
//! very [`harl_build::codegen::emit_module`] that ships, for the host's ISA variant only, as one module
//! of that project; `CARGO_TARGET_DIR` is `work_dir/target` and persists, so `harl` and rayon
//! compile once. A batch that fails to compile is narrowed down to the failing candidates (from
//! the file of each rustc error, else by bisection), so one bad candidate never costs the others;
//! a build killed at [`MeasureConfig::build_timeout`] is bisected the same way, each half with
//! half the limit.
//!
//! The reference is computed once per workload: random inputs from [`MeasureConfig::seed`]
//! (both signs, slices of one sign, a few large values: see [`ReferenceData::inputs`]) and the
//! interpreter's whole output when it has at most [`FULL_CHECK_MAX`] elements (and costs at
//! most [`FULL_CHECK_WORK`] to compute), else its value
//! at [`MeasureConfig::check_points`] random elements ([`harl_te::interp::eval_points`]),
//! written to a binary file the worker reads. Each candidate then runs in its own worker
//! process, under a wall-clock timeout, inside a rayon pool of [`MeasureConfig::threads`]
//! threads: one checked run, warm-up runs, then timed runs until both
//! [`MeasureConfig::min_time`] and [`MeasureConfig::min_repeats`] are reached; it reports the
//! median, minimum and maximum. A crash, a hang, a wrong result, a compile error or a schedule
//! that does not lower is one failed [`Measurement`], never a panic or a failed build.
//!
//! The checked run also rejects a kernel that writes outside its output or into its inputs
//! (guard elements around every buffer, a pristine copy of the inputs), that leaves an output
//! element unwritten (a sentinel pre-fill, scanned in full), or whose process prints a result
//! line of its own (the worker's line carries a per-run nonce the kernel cannot know; see
//! `parse_result`). All of it happens before or after the timed runs, never inside them.
//! `tests/measure.rs` feeds such known-bad candidates ([`Candidate::RawSource`]) to the
//! measurer.
//!
//! Caches are not flushed between repeats: kernels are timed warm, as they run back to back in
//! a network.

use harl_build::codegen::{emit_module, KernelMeta, Variant, VariantProgram};
use harl_build::lower::lower;
use harl_build::rng::Rng;
use harl_build::schedule::Schedule;
use harl_build::target::TargetFingerprint;
use harl_te::{interp, DType, Graph, ReduceOp};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{self, Read, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The package name of the worker project (also how its compiler messages are recognised).
const WORKER_PACKAGE: &str = "harl-measure-worker";
/// A bisected half's build limit never drops below this fraction of
/// [`MeasureConfig::build_timeout`], so a half of good candidates on a loaded machine is not
/// failed for the pathological one it no longer holds.
const BISECTED_TIMEOUT_FLOOR: u32 = 4;
/// Compiler messages and stderr tails kept in a [`TrialError`].
const MESSAGE_MAX: usize = 4000;
/// Numbers batches across all measurers of this process, so worker binaries never collide.
static BATCH_SERIAL: AtomicU64 = AtomicU64::new(0);
/// Bytes of a worker's stdout and stderr kept.
const PIPE_KEEP: usize = 64 * 1024;
/// Magic bytes of the reference data file.
const DATA_MAGIC: &[u8; 8] = b"HARLMD2\0";

/// How the measurer builds and runs candidates.
#[derive(Clone, Debug)]
pub struct MeasureConfig {
    /// The cargo project of the worker, its persistent target dir (`work_dir/target`), the
    /// reference data and the worker binaries live here. Several measurers (even in several
    /// processes) may share it: builds take a lock on `work_dir/.lock`.
    pub work_dir: PathBuf,
    /// Source directory of the `harl` facade crate, the worker's path dependency.
    pub harl_path: PathBuf,
    /// Threads of the rayon pool each candidate runs in (at least 1).
    pub threads: usize,
    /// Wall-clock limit of one candidate's worker process: check, warm-up and timed runs.
    pub timeout: Duration,
    /// Timed runs continue at least this long...
    pub min_time: Duration,
    /// ...and at least this many times (at least one run is always timed).
    pub min_repeats: usize,
    /// Untimed runs after the check, before timing.
    pub warmup: usize,
    /// Output elements checked against the interpreter, at random, for outputs over
    /// [`FULL_CHECK_MAX`] elements or graphs over [`FULL_CHECK_WORK`]; others (and outputs of
    /// at most this many elements) are checked in full.
    pub check_points: usize,
    /// Seed of the reference inputs and the checked elements.
    pub seed: u64,
    /// Once the task has a best latency ([`Measurer::set_best`]): a candidate whose first run
    /// takes longer than this multiple of it is timed by that one run (it cannot be the best;
    /// its latency still trains the cost model). 0 disables.
    pub slow_cutoff: f64,
    /// Once the task has a best latency: a candidate's worker is killed (a timeout) after
    /// `2 s + relative_timeout x best`, if that is shorter than `timeout`. 0 disables.
    pub relative_timeout: f64,
    /// A batch's build that takes longer than this is killed, compiler processes included, and
    /// the batch is bisected with half the limit per half (down to a quarter of it), so a
    /// pathological candidate fails alone; a normal batch takes seconds to a few minutes.
    pub build_timeout: Duration,
    /// Measure this ISA variant instead of the host's ([`host_variant`]): one the host runs,
    /// lower than its own, as `HARL_ISA` lowers what the runtime dispatches to (AVX2 records
    /// made on an AVX-512 machine). `None`: the host's.
    pub variant: Option<Variant>,
    /// Before each timed run, write this many bytes of another buffer (0: none), so that the
    /// kernel's weights and inputs come from memory rather than from the caches the previous
    /// run left warm: a network's tasks run that way (ResNet-50's weights are about 100 MB,
    /// and each task's were last touched a whole pass ago). Warm timing overstated a tile
    /// change that ran 1.2-1.35x faster alone and did not move the network.
    pub flush_bytes: usize,
}

/// The worker's environment variable that carries [`MeasureConfig::flush_bytes`].
const FLUSH_ENV: &str = "HARL_MEASURE_FLUSH_BYTES";

impl MeasureConfig {
    /// A configuration with defaults: all available cores, a 10 s timeout, timing for at least
    /// 100 ms and 3 runs after 1 warm-up run, 64 checked elements, seed 0; once a best latency
    /// is known, one timed run (after the checked one) for candidates over twice as slow and a
    /// timeout of 2 s + 100x best; a
    /// 10-minute build limit.
    pub fn new(work_dir: impl Into<PathBuf>, harl_path: impl Into<PathBuf>) -> Self {
        MeasureConfig {
            work_dir: work_dir.into(),
            harl_path: harl_path.into(),
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            timeout: Duration::from_secs(10),
            min_time: Duration::from_millis(100),
            min_repeats: 3,
            warmup: 1,
            check_points: 64,
            seed: 0,
            slow_cutoff: 2.0,
            relative_timeout: 100.0,
            build_timeout: Duration::from_secs(10 * 60),
            variant: None,
            flush_bytes: 0,
        }
    }
}

/// One thing to measure.
#[derive(Clone, Debug)]
pub enum Candidate {
    /// A schedule of the graph: lowered and emitted exactly as a build would ship it.
    Schedule(Schedule),
    /// Hand-written module items that define
    /// `pub fn run(inputs..., out) -> Result<(), harl::KernelError>` with the graph's signature
    /// (`&[T]` per input, `&mut [T]` for the output) and, for a graph with weights, `prepare`
    /// and `Prepared::run` as codegen emits them; for tests and fault injection.
    RawSource(String),
}

/// Why a trial failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TrialError {
    /// The schedule does not lower (nothing was compiled), or the reference could not be
    /// computed for the graph.
    #[error("invalid candidate: {0}")]
    Invalid(String),
    /// The candidate did not compile; the rustc messages, truncated.
    #[error("compile error: {0}")]
    Compile(String),
    /// The worker died: by a signal (e.g. `signal 11 (SIGSEGV)`), or with a non-zero exit code
    /// and the tail of its stderr (a panic).
    #[error("crashed: {0}")]
    Crash(String),
    /// The worker ran past [`MeasureConfig::timeout`] and was killed.
    #[error("timed out")]
    Timeout,
    /// The checked elements differ from the interpreter's.
    #[error("wrong result: {0}")]
    WrongResult(String),
}

/// The outcome of one trial.
#[derive(Clone, Debug, PartialEq)]
pub struct Measurement {
    /// Median run time in seconds; `None` when the trial failed.
    pub latency_s: Option<f64>,
    /// Fastest timed run in seconds (infinity when the trial failed).
    pub min_s: f64,
    /// Slowest timed run in seconds (infinity when the trial failed).
    pub max_s: f64,
    /// Timed runs.
    pub runs: usize,
    /// Why the trial failed, if it did.
    pub error: Option<TrialError>,
    /// This candidate's share of its batch's compile wall time (the batch time divided by the
    /// candidates that went to the compiler; 0 for those that did not).
    pub compile_s: f64,
}

impl Measurement {
    /// A failed trial.
    pub fn failed(error: TrialError, compile_s: f64) -> Self {
        Measurement {
            latency_s: None,
            min_s: f64::INFINITY,
            max_s: f64::INFINITY,
            runs: 0,
            error: Some(error),
            compile_s,
        }
    }

    /// Whether the candidate was measured (it compiled, ran and computed the right result).
    pub fn is_ok(&self) -> bool {
        self.error.is_none() && self.latency_s.is_some()
    }
}

/// Why a [`Measurer`] could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// A file or directory of the work dir could not be created or written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// `harl_path` is not the source directory of a crate.
    #[error("harl_path {0} has no Cargo.toml")]
    HarlPath(PathBuf),
    /// A setting is out of range.
    #[error("invalid measure configuration: {0}")]
    Config(String),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> MeasureError + '_ {
    move |source| MeasureError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Outputs of at most this many elements are checked in full, whatever
/// [`MeasureConfig::check_points`] says, when the interpreter's run of the whole graph costs
/// at most [`FULL_CHECK_WORK`]: no wrong element can hide between random points. Other
/// outputs are checked at `check_points` random elements, and every element of them is still
/// scanned for the pre-filled sentinel (a skipped element).
pub const FULL_CHECK_MAX: usize = 1 << 20;

/// The most interpreter work (reduction terms or elements, summed over the stages) a full check
/// may cost: about 64M terms, a few seconds once per workload in an optimised build script. A
/// 512x512x512 matmul is over it by 2x and checked at random points; a 256^3 one in full.
pub const FULL_CHECK_WORK: usize = 1 << 26;

/// What a candidate is checked against: inputs, the checked output elements and their values.
#[derive(Clone, Debug, PartialEq)]
pub struct ReferenceData {
    /// One buffer per graph input. Floats are mostly uniform in [-1, 1); along every axis about
    /// one index in eight is a *signed slice* whose elements all take one sign (negative where
    /// the graph has max reductions, positive where it has only min ones, alternating per input
    /// otherwise), so reductions over whole windows of one sign exist whatever axes are reduced
    /// (a max that starts at 0 instead of -inf is wrong there); and one element in 32 is scaled
    /// by 4 to 16 (a dropped or mis-signed large term stands out of the tolerance). i32 values
    /// are in -8..=8 without 0 (integer divisions stay defined), with the same signed slices.
    pub inputs: Vec<Vec<f64>>,
    /// Checked flat output indices, ascending, without repeats (always the first and the last;
    /// every element when the output has at most [`FULL_CHECK_MAX`] and the graph costs at
    /// most [`FULL_CHECK_WORK`]).
    pub points: Vec<usize>,
    /// The interpreter's output at `points`.
    pub expected: Vec<f64>,
    /// Relative tolerance: an element passes when `got == want` (infinities included) or
    /// `|got - want| <= tolerance * (1 + |want|)`; 1e-5 times the longest reduction of the graph
    /// (kernels contract into FMAs and reassociate, the interpreter does neither), and 0 for a
    /// graph that is integer throughout (wrapping i32 arithmetic is exact in any order).
    ///
    /// Why this stays safe with large inputs: reordering a K-term f32 sum changes it by about
    /// `u * K * sigma` in practice (u = 6e-8 the unit roundoff, sigma the spread of one term,
    /// about 1.5 for a product of two of these inputs), far under the tolerance's floor of
    /// 1e-5 K even where `want` cancels to near 0; while a dropped or mis-signed term shifts
    /// the element by the term itself, which is 0.1 or more for most terms. (A bound scaled by
    /// the sum of the terms' magnitudes would be looser by sqrt(K) and miss those.)
    pub tolerance: f64,
}

/// The reference for `graph` under `seed`: the same seed gives the same inputs and points.
pub fn reference_data(
    graph: &Graph,
    seed: u64,
    check_points: usize,
) -> Result<ReferenceData, interp::InterpError> {
    graph.validate()?;
    let mut rng = Rng::new(seed);
    let has = |op: ReduceOp| {
        graph
            .stages
            .iter()
            .any(|s| s.reduce.as_ref().is_some_and(|r| r.op == op))
    };
    let (max, min) = (has(ReduceOp::Max), has(ReduceOp::Min));
    let mut inputs = Vec::with_capacity(graph.inputs.len());
    for (pi, p) in graph.inputs.iter().enumerate() {
        let n: usize = p.shape.iter().product();
        let mut r = rng.fork();
        // Negative slices expose a max's identity, positive ones a min's.
        let negative = match (max, min) {
            (true, false) => true,
            (false, true) => false,
            _ => pi % 2 == 0,
        };
        let sign = if negative { -1.0 } else { 1.0 };
        let slices: Vec<Vec<bool>> = p
            .shape
            .iter()
            .map(|&e| (0..e).map(|_| r.chance(0.125)).collect())
            .collect();
        let mut idx = vec![0usize; p.shape.len()];
        let mut buf = Vec::with_capacity(n);
        for _ in 0..n {
            let signed = idx.iter().zip(&slices).any(|(&i, s)| s[i]);
            let v = match p.dtype {
                DType::I32 => {
                    let v = 1 + r.below(8) as i64;
                    (if r.chance(0.5) { -v } else { v }) as f64
                }
                _ => {
                    let v = r.unit() * 2.0 - 1.0;
                    if r.chance(1.0 / 32.0) {
                        v * (4.0 + 12.0 * r.unit())
                    } else {
                        v
                    }
                }
            };
            let v = if signed { sign * v.abs() } else { v };
            buf.push(match p.dtype {
                DType::F64 | DType::I32 => v,
                _ => v as f32 as f64,
            });
            // Row-major increment of the multi-index.
            for (d, &e) in p.shape.iter().enumerate().rev() {
                idx[d] += 1;
                if idx[d] < e {
                    break;
                }
                idx[d] = 0;
            }
        }
        inputs.push(buf);
    }
    let size = graph.stages.last().map_or(0, |s| s.size());
    let refs: Vec<&[f64]> = inputs.iter().map(Vec::as_slice).collect();
    let work = graph.stages.iter().fold(0usize, |w, s| {
        let terms = s
            .reduce
            .as_ref()
            .map_or(1, |r| r.extents.iter().product::<usize>());
        w.saturating_add(s.size().saturating_mul(terms.max(1)))
    });
    let full = size <= FULL_CHECK_MAX && work <= FULL_CHECK_WORK;
    let (points, expected) = if check_points >= size || full {
        // One plain run beats point-wise evaluation (memoised per element) for a whole output.
        ((0..size).collect(), interp::run(graph, &refs)?)
    } else {
        let mut r = rng.fork();
        let mut v = vec![0, size - 1];
        v.extend((0..check_points.saturating_sub(2)).map(|_| r.below(size)));
        v.sort_unstable();
        v.dedup();
        let expected = interp::eval_points(graph, &refs, &v)?;
        (v, expected)
    };
    let longest = graph
        .stages
        .iter()
        .filter_map(|s| s.reduce.as_ref())
        .map(|r| r.extents.iter().product::<usize>())
        .max()
        .unwrap_or(1)
        .max(1);
    let integer = graph
        .inputs
        .iter()
        .map(|p| p.dtype)
        .chain(graph.stages.iter().map(|s| s.dtype))
        .all(|d| matches!(d, DType::I32 | DType::Bool));
    Ok(ReferenceData {
        inputs,
        points,
        expected,
        tolerance: if integer { 0.0 } else { 1e-5 * longest as f64 },
    })
}

/// The ISA variant this machine runs: the one whose class is the host fingerprint's (AVX-512
/// only with AVX-512VL, as `harl::runtime::Isa::detect` dispatches).
pub fn host_variant() -> Variant {
    let fp = TargetFingerprint::host();
    let v = Variant::ALL
        .into_iter()
        .find(|v| v.isa_class(&fp.arch) == fp.isa_class)
        .unwrap_or(Variant::Base);
    if v == Variant::Avx512 && !fp.has_feature("avx512vl") {
        Variant::Avx2
    } else {
        v
    }
}

/// A batch that is compiled and ready to run ([`Measurer::prepare`]).
#[derive(Debug)]
pub struct PreparedBatch {
    /// Per candidate: its slot in the worker binary, or the measurement it already failed with.
    slots: Vec<Result<usize, Measurement>>,
    compile_s: Vec<f64>,
    binary: Option<PathBuf>,
    data: Option<Arc<PathBuf>>,
}

impl PreparedBatch {
    /// Candidates in the batch.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the batch has no candidate.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

impl Drop for PreparedBatch {
    fn drop(&mut self) {
        if let Some(b) = &self.binary {
            let _ = fs::remove_file(b);
        }
    }
}

/// Compiles, checks and times candidates out of process. See the [module docs](self).
#[derive(Debug)]
pub struct Measurer {
    config: MeasureConfig,
    variant: Variant,
    /// Reference data file per (workload key); written once per measurer.
    data: Mutex<HashMap<String, Result<Arc<PathBuf>, String>>>,
    /// Best latency of the task being measured, if known ([`Measurer::set_best`]).
    best_s: Option<f64>,
}

impl Measurer {
    /// Validates the configuration and writes the worker project's manifest (copying the
    /// `Cargo.lock` found at or above `harl_path`, so the worker builds with the workspace's
    /// locked versions). Nothing is compiled yet.
    pub fn new(config: MeasureConfig) -> Result<Self, MeasureError> {
        if config.threads == 0 {
            return Err(MeasureError::Config("threads must be at least 1".into()));
        }
        if config.timeout <= config.min_time {
            return Err(MeasureError::Config(format!(
                "the timeout ({:?}) must exceed min_time ({:?})",
                config.timeout, config.min_time
            )));
        }
        if config.build_timeout.is_zero() {
            return Err(MeasureError::Config(
                "build_timeout must be positive".into(),
            ));
        }
        let harl_path = fs::canonicalize(&config.harl_path)
            .map_err(|_| MeasureError::HarlPath(config.harl_path.clone()))?;
        if !harl_path.join("Cargo.toml").is_file() {
            return Err(MeasureError::HarlPath(config.harl_path.clone()));
        }
        for sub in ["src", "data", "bin", "logs"] {
            let d = config.work_dir.join(sub);
            fs::create_dir_all(&d).map_err(io_err(&d))?;
        }
        let work_dir = fs::canonicalize(&config.work_dir).map_err(io_err(&config.work_dir))?;
        let config = MeasureConfig {
            work_dir,
            harl_path,
            ..config
        };
        let host = host_variant();
        let variant = config.variant.unwrap_or(host);
        let rank = |v: Variant| Variant::ALL.iter().position(|&x| x == v);
        if rank(variant) < rank(host) {
            return Err(MeasureError::Config(format!(
                "this machine runs the {} variant at most, not {}",
                host.name(),
                variant.name()
            )));
        }
        let m = Measurer {
            variant,
            data: Mutex::new(HashMap::new()),
            best_s: None,
            config,
        };
        let lock = m.lock()?;
        m.write_manifest()?;
        drop(lock);
        Ok(m)
    }

    /// The configuration (paths canonicalised).
    pub fn config(&self) -> &MeasureConfig {
        &self.config
    }

    /// Sets the best latency known for the graph measured next (`None`: unknown); it scales
    /// [`MeasureConfig::slow_cutoff`] and [`MeasureConfig::relative_timeout`].
    pub fn set_best(&mut self, best_s: Option<f64>) {
        self.best_s = best_s.filter(|b| b.is_finite() && *b > 0.0);
    }

    /// The wall-clock limit of one candidate and the one-run cutoff in seconds (0: none),
    /// given the best latency known.
    fn limits(&self, best: Option<f64>) -> (Duration, f64) {
        let c = &self.config;
        let Some(best) = best else {
            return (c.timeout, 0.0);
        };
        let timeout = if c.relative_timeout > 0.0 {
            c.timeout
                .min(Duration::from_secs_f64(2.0 + c.relative_timeout * best))
                .max(c.min_time + Duration::from_secs(1))
        } else {
            c.timeout
        };
        (timeout, (c.slow_cutoff * best).max(0.0))
    }

    /// The ISA variant candidates are emitted and measured for.
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// The `HARL_ISA` a worker runs with: none for the host's variant, else the lower one it
    /// measures (the worker checks that it dispatches to the variant it was built for).
    fn isa_override(&self) -> Option<(&'static str, &'static str)> {
        match self.variant {
            v if v == host_variant() => None,
            Variant::Avx2 => Some(("HARL_ISA", "avx2")),
            _ => Some(("HARL_ISA", "baseline")),
        }
    }

    /// Measures a batch of candidates of `graph`: one [`Measurement`] per candidate, in order.
    /// The batch compiles as one project; candidates run one at a time.
    pub fn measure(&mut self, graph: &Graph, candidates: &[Candidate]) -> Vec<Measurement> {
        let batch = self.prepare(graph, candidates);
        self.run_prepared(&batch)
    }

    /// Measures several batches of `graph`, compiling batch `i + 1` while batch `i` runs.
    ///
    /// The compiler then competes with the kernels being timed: worth it with cores to spare
    /// (a `threads` setting well below the core count), noisy otherwise; [`Measurer::measure`]
    /// keeps the two apart.
    pub fn measure_pipelined(
        &mut self,
        graph: &Graph,
        batches: &[Vec<Candidate>],
    ) -> Vec<Vec<Measurement>> {
        let this: &Measurer = self;
        let mut out = Vec::with_capacity(batches.len());
        let Some(first) = batches.first() else {
            return out;
        };
        let mut current = this.prepare(graph, first);
        for next in batches.iter().skip(1) {
            let (done, prepared) = std::thread::scope(|s| {
                let builder = s.spawn(|| this.prepare(graph, next));
                let done = this.run_prepared(&current);
                let prepared = builder.join().unwrap_or_else(|_| {
                    // `prepare` does not panic; should it, the batch fails as a whole.
                    this.failed_batch(next.len(), "the compile thread panicked")
                });
                (done, prepared)
            });
            out.push(done);
            current = prepared;
        }
        out.push(this.run_prepared(&current));
        out
    }

    /// The first half of [`Measurer::measure`]: lowers, emits and compiles the candidates and
    /// computes the reference. Safe to call from another thread while a batch runs.
    pub fn prepare(&self, graph: &Graph, candidates: &[Candidate]) -> PreparedBatch {
        let serial = BATCH_SERIAL.fetch_add(1, Ordering::Relaxed);
        let data = match self.data_file(graph) {
            Ok(d) => d,
            Err(e) => {
                let mut b = self.failed_batch(candidates.len(), "");
                for s in &mut b.slots {
                    *s = Err(Measurement::failed(TrialError::Invalid(e.clone()), 0.0));
                }
                return b;
            }
        };
        let mut slots: Vec<Result<usize, Measurement>> = Vec::with_capacity(candidates.len());
        let mut sources: Vec<(usize, String)> = Vec::new();
        for (i, c) in candidates.iter().enumerate() {
            match self.source(graph, c) {
                Ok(src) => {
                    sources.push((i, src));
                    let unbuilt = TrialError::Compile("the candidate was not built".into());
                    slots.push(Err(Measurement::failed(unbuilt, 0.0)));
                }
                Err(e) => slots.push(Err(Measurement::failed(e, 0.0))),
            }
        }
        let mut compile_s = vec![0.0; candidates.len()];
        let mut binary = None;
        if !sources.is_empty() {
            let t = Instant::now();
            let outcome = self.compile(graph, &sources, serial);
            let share = t.elapsed().as_secs_f64() / sources.len() as f64;
            for (i, _) in &sources {
                compile_s[*i] = share;
            }
            match outcome {
                Ok((path, good, errors)) => {
                    binary = path;
                    for (slot, i) in good.iter().enumerate() {
                        slots[*i] = Ok(slot);
                    }
                    for (i, msg) in errors {
                        slots[i] = Err(Measurement::failed(TrialError::Compile(msg), share));
                    }
                }
                Err(msg) => {
                    for (i, _) in &sources {
                        slots[*i] =
                            Err(Measurement::failed(TrialError::Compile(msg.clone()), share));
                    }
                }
            }
        }
        PreparedBatch {
            slots,
            compile_s,
            binary,
            data: Some(data),
        }
    }

    /// The second half of [`Measurer::measure`]: runs each compiled candidate of the batch in
    /// its own worker process, one after the other.
    pub fn run_prepared(&self, batch: &PreparedBatch) -> Vec<Measurement> {
        // The best latency known, updated as the batch runs, scales the limits of the rest.
        let mut best = self.best_s;
        let mut out = Vec::with_capacity(batch.slots.len());
        for (slot, &compile_s) in batch.slots.iter().zip(&batch.compile_s) {
            let m = match slot {
                Err(m) => m.clone(),
                Ok(slot) => {
                    let mut m = match (&batch.binary, &batch.data) {
                        (Some(bin), Some(data)) => self.run_one(bin, *slot, data, best),
                        _ => Measurement::failed(
                            TrialError::Compile("no worker binary was built".into()),
                            0.0,
                        ),
                    };
                    m.compile_s = compile_s;
                    m
                }
            };
            if let Some(l) = m.latency_s.filter(|l| l.is_finite() && *l > 0.0) {
                best = Some(best.map_or(l, |b| b.min(l)));
            }
            out.push(m);
        }
        out
    }

    fn failed_batch(&self, n: usize, why: &str) -> PreparedBatch {
        PreparedBatch {
            slots: (0..n)
                .map(|_| Err(Measurement::failed(TrialError::Compile(why.into()), 0.0)))
                .collect(),
            compile_s: vec![0.0; n],
            binary: None,
            data: None,
        }
    }

    /// The module items of a candidate, or why it has none.
    fn source(&self, graph: &Graph, c: &Candidate) -> Result<String, TrialError> {
        match c {
            Candidate::RawSource(s) => Ok(s.clone()),
            Candidate::Schedule(schedule) => {
                let program =
                    lower(graph, schedule).map_err(|e| TrialError::Invalid(e.to_string()))?;
                let variants = vec![VariantProgram {
                    variant: self.variant,
                    program,
                    source: "measured candidate".into(),
                }];
                Ok(emit_module(graph, &variants, &kernel_meta(graph)))
            }
        }
    }

    /// The reference data file of `graph`, computed and written on first use.
    fn data_file(&self, graph: &Graph) -> Result<Arc<PathBuf>, String> {
        let key = graph.workload_key();
        let mut cache = self.data.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = cache.get(&key) {
            return r.clone();
        }
        let made = self.write_data(graph, &key).map(Arc::new);
        cache.insert(key, made.clone());
        made
    }

    fn write_data(&self, graph: &Graph, key: &str) -> Result<PathBuf, String> {
        let c = &self.config;
        let r = reference_data(graph, c.seed, c.check_points)
            .map_err(|e| format!("the reference interpreter failed: {e}"))?;
        let bytes = encode_data(graph, &r)?;
        let path = c
            .work_dir
            .join("data")
            .join(format!("{key}-{:016x}-{}.bin", c.seed, c.check_points));
        let tmp = path.with_extension(format!(
            "tmp{}-{}",
            std::process::id(),
            BATCH_SERIAL.fetch_add(1, Ordering::Relaxed)
        ));
        fs::write(&tmp, bytes)
            .and_then(|()| fs::rename(&tmp, &path))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    }

    fn lock(&self) -> Result<File, MeasureError> {
        let path = self.config.work_dir.join(".lock");
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_err(&path))?;
        f.lock().map_err(io_err(&path))?;
        Ok(f)
    }

    fn write_manifest(&self) -> Result<(), MeasureError> {
        let c = &self.config;
        let manifest = format!(
            "# @generated by harl-build's measurer.\n[package]\nname = \"{WORKER_PACKAGE}\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n[[bin]]\nname = \"worker\"\npath = \"src/main.rs\"\n\n[dependencies]\nharl = {{ path = {} }}\nrayon = \"1\"\n\n[profile.release]\nopt-level = 3\n\n[workspace]\n",
            toml_str(&c.harl_path.to_string_lossy())
        );
        let path = c.work_dir.join("Cargo.toml");
        write_if_changed(&path, &manifest).map_err(io_err(&path))?;
        // The workspace's lock pins the versions (rayon's above all) the user's build gets;
        // copied again whenever it is newer than the worker's (which cargo then prunes).
        let lock = c.work_dir.join("Cargo.lock");
        let found = c
            .harl_path
            .ancestors()
            .map(|d| d.join("Cargo.lock"))
            .find(|p| p.is_file());
        if let Some(found) = found {
            let mtime = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
            let stale = match (mtime(&found), mtime(&lock)) {
                (Some(src), Some(dst)) => src > dst,
                (_, None) => true,
                (None, Some(_)) => false,
            };
            if stale {
                fs::copy(&found, &lock).map_err(io_err(&lock))?;
            }
        }
        Ok(())
    }

    /// Compiles the candidates, dropping those that fail. Returns the worker binary (when any
    /// candidate compiled), the candidates in it in slot order, and the compile error of each
    /// failed one; `Err` when the build fails for all of them alike (a dependency, cargo itself).
    #[allow(clippy::type_complexity)]
    fn compile(
        &self,
        graph: &Graph,
        sources: &[(usize, String)],
        serial: u64,
    ) -> Result<(Option<PathBuf>, Vec<usize>, BTreeMap<usize, String>), String> {
        let _lock = self.lock().map_err(|e| e.to_string())?;
        self.write_manifest().map_err(|e| e.to_string())?;
        let src = self.config.work_dir.join("src");
        for (i, code) in sources {
            let text = candidate_file(graph, *i, code);
            let p = src.join(format!("cand{i}.rs"));
            write_if_changed(&p, &text).map_err(|e| format!("{}: {e}", p.display()))?;
        }
        let mut errors = BTreeMap::new();
        let all: Vec<usize> = sources.iter().map(|(i, _)| *i).collect();
        let mut last_ok = None;
        let limit = self.config.build_timeout;
        let mut good = self.isolate(graph, all, limit, &mut errors, &mut last_ok)?;
        // After a bisection the last successful build may hold only part of the good set.
        let mut tries = 0;
        while !good.is_empty() && last_ok.as_ref() != Some(&good) {
            tries += 1;
            if tries > 2 {
                let msg = "the candidates compile apart but not together".to_string();
                for i in good {
                    errors.insert(i, msg.clone());
                }
                return Ok((None, Vec::new(), errors));
            }
            good = self.isolate(graph, good, limit, &mut errors, &mut last_ok)?;
        }
        if good.is_empty() {
            return Ok((None, good, errors));
        }
        let exe = self
            .config
            .work_dir
            .join("target")
            .join("release")
            .join(format!("worker{}", std::env::consts::EXE_SUFFIX));
        let bin = self.config.work_dir.join("bin").join(format!(
            "worker-{}-{serial}{}",
            std::process::id(),
            std::env::consts::EXE_SUFFIX
        ));
        fs::copy(&exe, &bin).map_err(|e| format!("{}: {e}", exe.display()))?;
        Ok((Some(bin), good, errors))
    }

    /// The subset of `set` that compiles within `limit`, recording why the others do not.
    fn isolate(
        &self,
        graph: &Graph,
        mut set: Vec<usize>,
        limit: Duration,
        errors: &mut BTreeMap<usize, String>,
        last_ok: &mut Option<Vec<usize>>,
    ) -> Result<Vec<usize>, String> {
        loop {
            if set.is_empty() {
                return Ok(set);
            }
            // Why the set failed as a whole, and the limit each half gets if it is split.
            let (why, half_limit) = match self.build(graph, &set, limit)? {
                Built::Ok => {
                    *last_ok = Some(set.clone());
                    return Ok(set);
                }
                Built::Errors { by_candidate, .. } if !by_candidate.is_empty() => {
                    set.retain(|i| !by_candidate.contains_key(i));
                    errors.extend(by_candidate);
                    continue;
                }
                Built::Errors { unattributed, .. } => (unattributed, limit),
                // Build time grows with the source, so half the candidates get half the time;
                // the floor keeps good halves from failing on a slow machine.
                Built::TimedOut => (
                    format!("its build passed the limit of {} s", limit.as_secs_f64()),
                    (limit / 2).max(self.config.build_timeout / BISECTED_TIMEOUT_FLOOR),
                ),
            };
            if set.len() == 1 {
                errors.insert(set[0], why);
                return Ok(Vec::new());
            }
            let right = set.split_off(set.len() / 2);
            let mut good = self.isolate(graph, set, half_limit, errors, last_ok)?;
            good.extend(self.isolate(graph, right, half_limit, errors, last_ok)?);
            return Ok(good);
        }
    }

    /// One `cargo build` of the worker with the candidates in `set` (in slot order), killed
    /// after `limit`.
    fn build(&self, graph: &Graph, set: &[usize], limit: Duration) -> Result<Built, String> {
        let c = &self.config;
        let main = worker_main(graph, set, self.variant);
        let main_path = c.work_dir.join("src").join("main.rs");
        fs::write(&main_path, main).map_err(|e| format!("{}: {e}", main_path.display()))?;
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let logs = c.work_dir.join("logs");
        let out_path = logs.join(format!("build-{}.json", std::process::id()));
        let err_path = logs.join(format!("build-{}.txt", std::process::id()));
        let (out, err) = (
            File::create(&out_path).map_err(|e| format!("{}: {e}", out_path.display()))?,
            File::create(&err_path).map_err(|e| format!("{}: {e}", err_path.display()))?,
        );
        let mut command = Command::new(&cargo);
        // Its own process group, so a timeout kills rustc too, not only cargo.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command
            .args(["build", "--release", "--offline", "--message-format=json"])
            .arg("--manifest-path")
            .arg(c.work_dir.join("Cargo.toml"))
            .current_dir(&c.work_dir)
            .env("CARGO_TARGET_DIR", c.work_dir.join("target"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", Path::new(&cargo).display()))?;
        let status =
            wait_with_timeout(&mut child, limit).map_err(|e| format!("waiting for cargo: {e}"))?;
        if status.is_none() {
            kill_process_group(child.id());
        }
        let stdout = fs::read_to_string(&out_path).unwrap_or_default();
        let stderr = fs::read_to_string(&err_path).unwrap_or_default();
        let _ = fs::remove_file(&out_path);
        let _ = fs::remove_file(&err_path);
        match status {
            None => Ok(Built::TimedOut),
            Some(s) if s.success() => Ok(Built::Ok),
            Some(_) => classify_build_errors(&stdout, &stderr),
        }
    }

    /// Runs one candidate in its own worker process.
    fn run_one(&self, bin: &Path, slot: usize, data: &Path, best: Option<f64>) -> Measurement {
        let c = &self.config;
        let (timeout, cutoff_s) = self.limits(best);
        let crash = |msg: String| Measurement::failed(TrialError::Crash(msg), 0.0);
        let spawned = Command::new(bin)
            .arg(slot.to_string())
            .arg(data)
            .arg(c.threads.to_string())
            .arg(c.min_time.as_millis().to_string())
            .arg(c.min_repeats.to_string())
            .arg(c.warmup.to_string())
            .arg(format!("{cutoff_s:e}"))
            .env_remove("HARL_ISA")
            .envs(self.isa_override())
            .env(FLUSH_ENV, c.flush_bytes.to_string())
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => return crash(format!("cannot run the worker: {e}")),
        };
        // The nonce through stdin, closed at once: a few bytes, under any pipe's buffer, so
        // the write does not block; a worker that dies first is reported by its exit status.
        let nonce = run_nonce();
        if let Some(mut stdin) = child.stdin.take() {
            let _ = writeln!(stdin, "{nonce}");
        }
        let deadline = Instant::now() + timeout;
        // The worker's stdout closes when it exits: waiting for that needs no polling.
        let stdout = child.stdout.take().map(read_tail);
        let stderr = child.stderr.take().map(read_tail);
        let out = match &stdout {
            Some(rx) => rx.recv_timeout(timeout).ok(),
            None => None,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let status = match wait_with_timeout(&mut child, left) {
            Ok(status) => status,
            Err(e) => return crash(format!("waiting for the worker: {e}")),
        };
        let Some(status) = status else {
            return Measurement::failed(TrialError::Timeout, 0.0);
        };
        let grace = Duration::from_secs(1);
        let out = out
            .or_else(|| stdout.and_then(|rx| rx.recv_timeout(grace).ok()))
            .unwrap_or_default();
        if status.success() {
            parse_result(&out, &nonce)
        } else {
            let err = stderr
                .and_then(|rx| rx.recv_timeout(grace).ok())
                .unwrap_or_default();
            crash(describe_exit(status, &err))
        }
    }
}

/// Reads a pipe to its end on a thread, keeping the last [`PIPE_KEEP`] bytes (a candidate may
/// print without end); the text arrives on the channel at end of file.
fn read_tail(mut pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut kept: Vec<u8> = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    kept.extend_from_slice(&buf[..n]);
                    if kept.len() > 2 * PIPE_KEEP {
                        kept.drain(..kept.len() - PIPE_KEEP);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = tx.send(String::from_utf8_lossy(&kept).into_owned());
    });
    rx
}

/// The outcome of one build.
enum Built {
    Ok,
    /// Killed at its time limit.
    TimedOut,
    Errors {
        /// Errors located in a candidate's file, per candidate.
        by_candidate: BTreeMap<usize, String>,
        /// Errors of the worker package located elsewhere (the harness, the linker).
        unattributed: String,
    },
}

/// Sorts a failed build's compiler errors by candidate; `Err` when the failure is not the
/// worker's code (a dependency, resolution, cargo itself): no candidate is to blame.
fn classify_build_errors(stdout: &str, stderr: &str) -> Result<Built, String> {
    let mut by_candidate: BTreeMap<usize, String> = BTreeMap::new();
    let mut unattributed = String::new();
    let mut foreign = String::new();
    for line in stdout.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] != "compiler-message" {
            continue;
        }
        let msg = &v["message"];
        let level = msg["level"].as_str().unwrap_or("");
        if !level.starts_with("error") {
            continue;
        }
        let text = msg["message"].as_str().unwrap_or("");
        if text.starts_with("aborting due to") {
            continue;
        }
        let rendered = msg["rendered"].as_str().unwrap_or(text);
        let ours = v["package_id"]
            .as_str()
            .is_some_and(|p| p.contains(WORKER_PACKAGE));
        if !ours {
            push_capped(&mut foreign, rendered);
            continue;
        }
        let file = msg["spans"].as_array().and_then(|spans| {
            spans
                .iter()
                .find(|s| s["is_primary"] == true)
                .or_else(|| spans.first())
                .and_then(|s| s["file_name"].as_str())
        });
        match file.and_then(candidate_of_file) {
            Some(i) => push_capped(by_candidate.entry(i).or_default(), rendered),
            None => push_capped(&mut unattributed, rendered),
        }
    }
    if !foreign.is_empty() {
        return Err(format!("a dependency failed to compile:\n{foreign}"));
    }
    if by_candidate.is_empty() && unattributed.is_empty() {
        return Err(format!("cargo failed:\n{}", tail(stderr, MESSAGE_MAX)));
    }
    Ok(Built::Errors {
        by_candidate,
        unattributed,
    })
}

/// `src/cand12.rs` → 12.
fn candidate_of_file(file: &str) -> Option<usize> {
    let name = Path::new(file).file_name()?.to_str()?;
    name.strip_prefix("cand")?.strip_suffix(".rs")?.parse().ok()
}

fn push_capped(buf: &mut String, text: &str) {
    if buf.len() >= MESSAGE_MAX {
        return;
    }
    buf.push_str(text);
    if buf.len() > MESSAGE_MAX {
        let mut end = MESSAGE_MAX;
        while !buf.is_char_boundary(end) {
            end -= 1;
        }
        buf.truncate(end);
        buf.push_str("\n[truncated]");
    }
}

/// The last `max` bytes of `s` (at a char boundary).
fn tail(s: &str, max: usize) -> &str {
    let s = s.trim_end();
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Waits for `child`; `None` when it ran past `timeout` (it is then killed and reaped).
fn wait_with_timeout(child: &mut Child, timeout: Duration) -> io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    let mut nap = Duration::from_micros(200);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let now = Instant::now();
        if now >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(nap.min(deadline - now));
        nap = (nap * 2).min(Duration::from_millis(10));
    }
}

/// Kills every process of group `pgid` (a timed-out build's compilers). Through the shell's
/// `kill` builtin (no `unsafe` signal call for a safety net, and no dependency on a `kill`
/// binary, which minimal systems lack).
fn kill_process_group(pgid: u32) {
    #[cfg(unix)]
    {
        let _ = Command::new("sh")
            .args(["-c", &format!("kill -s KILL -- -{pgid}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    #[cfg(not(unix))]
    let _ = pgid;
}

/// Why a worker exited unsuccessfully: the signal, or the exit code and stderr's tail.
fn describe_exit(status: ExitStatus, stderr: &str) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            let name = match sig {
                4 => " (SIGILL)",
                6 => " (SIGABRT)",
                7 => " (SIGBUS)",
                8 => " (SIGFPE)",
                9 => " (SIGKILL)",
                11 => " (SIGSEGV)",
                15 => " (SIGTERM)",
                _ => "",
            };
            let t = tail(stderr, 1000);
            return if t.is_empty() {
                format!("signal {sig}{name}")
            } else {
                format!("signal {sig}{name}: {t}")
            };
        }
    }
    match status.code() {
        Some(code) => format!("exit code {code}: {}", tail(stderr, MESSAGE_MAX)),
        None => format!("{status}: {}", tail(stderr, MESSAGE_MAX)),
    }
}

/// A fresh nonce for one worker run: 128 bits from std's randomly keyed SipHash (its keys
/// come from the OS's random source once per thread), over a counter and the clock.
fn run_nonce() -> String {
    use std::hash::{BuildHasher, Hasher};
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let half = |salt: u64| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(salt);
        h.write_u64(run);
        h.write_u128(now);
        h.write_u32(std::process::id());
        h.finish()
    };
    format!("{:016x}{:016x}", half(1), half(2))
}

/// Reads the worker's result: the line of stdout that is a JSON object with this run's nonce.
///
/// The kernel runs inside the worker and shares its stdout, so it could print a line in the
/// worker's format (a tiny time, then exit or carry on). The nonce is made per run by the
/// parent and reaches the worker through stdin, which the worker drains before any kernel
/// runs: not compiled into the binary, not in argv, the environment or /proc/self/environ (an
/// environment variable stays readable there after `remove_var`), so a kernel cannot know it.
/// A result-like line without it (a `nonce`, `median_s` or `wrong` key) is a forgery and
/// fails the candidate even if the real line follows. (This guards against a kernel that
/// prints, not one that reads the worker's memory; candidates are generated code, and the
/// self-test's hostile ones print.)
fn parse_result(stdout: &str, nonce: &str) -> Measurement {
    let crash = |msg: String| Measurement::failed(TrialError::Crash(msg), 0.0);
    let mut result = None;
    for line in stdout.lines().map(str::trim).filter(|l| l.starts_with('{')) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["nonce"].as_str() == Some(nonce) {
            result = Some((line, v));
        } else if ["nonce", "median_s", "wrong"]
            .iter()
            .any(|k| v.get(k).is_some())
        {
            return Measurement::failed(
                TrialError::WrongResult(format!(
                    "the kernel printed a result line of its own: {}",
                    tail(line, 200)
                )),
                0.0,
            );
        }
    }
    let Some((line, v)) = result else {
        return crash(format!(
            "the worker printed no result: {}",
            tail(stdout, 1000)
        ));
    };
    if let Some(w) = v["wrong"].as_str() {
        return Measurement::failed(TrialError::WrongResult(w.to_string()), 0.0);
    }
    match (
        v["median_s"].as_f64(),
        v["min_s"].as_f64(),
        v["max_s"].as_f64(),
        v["runs"].as_u64(),
    ) {
        (Some(median), Some(min), Some(max), Some(runs)) => Measurement {
            latency_s: Some(median),
            min_s: min,
            max_s: max,
            runs: runs as usize,
            error: None,
            compile_s: 0.0,
        },
        _ => crash(format!("unreadable worker result {line:?}")),
    }
}

fn write_if_changed(path: &Path, text: &str) -> io::Result<()> {
    if fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    fs::write(path, text)
}

/// A TOML string for a path: a literal string unless it holds a quote.
fn toml_str(s: &str) -> String {
    if !s.contains('\'') && !s.contains('\n') {
        return format!("'{s}'");
    }
    let mut out = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Names in the generated module: parameters `x0..`, output `out`.
fn kernel_meta(graph: &Graph) -> KernelMeta {
    KernelMeta {
        name: "candidate".into(),
        params: (0..graph.inputs.len()).map(|i| format!("x{i}")).collect(),
        output: "out".into(),
    }
}

fn out_type(graph: &Graph) -> &'static str {
    graph.stages.last().map_or("f32", |s| s.dtype.rust_name())
}

/// The candidate's file: its items in a module, and a `run` with the batch's signature (so a
/// raw source with the wrong signature fails in its own file, not in the harness). For a graph
/// with weights, `run` prepares them on its first call and runs the prepared kernel after: a
/// worker calls its candidate with the same inputs every time, and a model prepares its weights
/// once, at load, so the timed calls are what a model's calls cost. The first call is the
/// checked one, so the prepared path is the one checked against the reference.
fn candidate_file(graph: &Graph, i: usize, code: &str) -> String {
    let mut params: Vec<String> = graph
        .inputs
        .iter()
        .enumerate()
        .map(|(j, p)| format!("x{j}: &[{}]", p.dtype.rust_name()))
        .collect();
    params.push(format!("out: &mut [{}]", out_type(graph)));
    let arg_list = |take: &dyn Fn(bool) -> bool, out: bool| {
        let mut args: Vec<String> = (0..graph.inputs.len())
            .filter(|&j| take(graph.inputs[j].constant))
            .map(|j| format!("x{j}"))
            .collect();
        if out {
            args.push("out".into());
        }
        args.join(", ")
    };
    let body = if graph.inputs.iter().any(|p| p.constant) {
        format!(
            "    static PREPARED: ::std::sync::OnceLock<::core::result::Result<kernel::Prepared, ::harl::KernelError>> = ::std::sync::OnceLock::new();\n    \
             let prepared = PREPARED.get_or_init(|| kernel::prepare({weights})).as_ref().map_err(|e| e.clone())?;\n    \
             prepared.run({others})",
            weights = arg_list(&|c| c, false),
            others = arg_list(&|c| !c, true),
        )
    } else {
        format!("    kernel::run({})", arg_list(&|_| true, true))
    };
    format!(
        "// @generated by harl-build's measurer: candidate {i} of the current batch.\n\
         #[allow(warnings, clippy::all)]\nmod kernel {{\n{code}\n}}\n\n\
         #[allow(clippy::all)]\npub(crate) fn run({params}) -> ::core::result::Result<(), ::harl::KernelError> {{\n{body}\n}}\n",
        params = params.join(", "),
    )
}

/// The worker's `main.rs` for the candidates in `set` (slot `k` is candidate `set[k]`).
fn worker_main(graph: &Graph, set: &[usize], variant: Variant) -> String {
    let mut s = String::from(
        "// @generated by harl-build's measurer: the worker of one batch. Do not edit.\n#![allow(warnings, clippy::all)]\n\n",
    );
    for i in set {
        let _ = writeln!(s, "mod cand{i};");
    }
    let tys: Vec<&str> = graph.inputs.iter().map(|p| p.dtype.rust_name()).collect();
    let mut sig: Vec<String> = tys.iter().map(|t| format!("&[{t}]")).collect();
    sig.push("&mut [Out]".into());
    let _ = writeln!(
        s,
        "\ntype Kernel = fn({}) -> ::core::result::Result<(), ::harl::KernelError>;",
        sig.join(", ")
    );
    let _ = writeln!(s, "type Out = {};", out_type(graph));
    let kernels: Vec<String> = set.iter().map(|i| format!("cand{i}::run")).collect();
    let _ = writeln!(s, "const KERNELS: &[Kernel] = &[{}];", kernels.join(", "));
    let _ = writeln!(s, "const ISA: &str = {:?};", variant.name());
    let bufs: Vec<String> = tys.iter().map(|t| format!("Guarded<{t}>")).collect();
    let _ = writeln!(s, "#[derive(Clone)]\nstruct Inputs({});", bufs.join(", "));
    let reads: Vec<&str> = tys.iter().map(|_| "r.guarded()?").collect();
    let _ = writeln!(
        s,
        "fn read_inputs(r: &mut Reader) -> Result<Inputs, String> {{ Ok(Inputs({})) }}",
        reads.join(", ")
    );
    let mut args: Vec<String> = (0..tys.len()).map(|j| format!("x.{j}.inner()")).collect();
    args.push("out".into());
    let _ = writeln!(
        s,
        "fn call(k: Kernel, x: &Inputs, out: &mut [Out]) -> ::core::result::Result<(), ::harl::KernelError> {{ k({}) }}",
        args.join(", ")
    );
    let diffs: Vec<String> = (0..tys.len())
        .map(|j| format!("    if let Some(d) = x.{j}.diff(&y.{j}) {{ return Some(format!(\"input {j}, {{d}}\")); }}\n"))
        .collect();
    let _ = writeln!(
        s,
        "/// Where `x` differs from the pristine copy `y`, if anywhere.\nfn inputs_changed(x: &Inputs, y: &Inputs) -> Option<String> {{\n{}    None\n}}",
        diffs.concat()
    );
    s.push_str(WORKER_HARNESS);
    s
}

/// The fixed part of the worker (see [`worker_main`] for the per-batch part).
///
/// What the checked run guards against, besides a wrong value at a checked element: every
/// buffer the kernel gets (inputs and output) sits between `GUARD`-element runs of a guard
/// value that must be intact afterwards (a write past either end); the inputs must equal a
/// pristine copy (a write through a `&[T]`); the output is pre-filled with a sentinel and no
/// element may keep it (a skipped element, caught even where no point is checked; a value
/// that equals the sentinel by chance, an i32 say, is told apart by a second run with another
/// sentinel). Guards and inputs are checked again after the timed runs. None of this touches
/// the timed loop: the buffers the kernel gets start on a cache line, as every buffer harl
/// allocates does (`harl::runtime::AlignedBuf`; the guard is a multiple of 64 bytes).
///
/// The result line carries a nonce the parent writes to the worker's stdin, read to its end
/// before any kernel runs; see `parse_result`.
const WORKER_HARNESS: &str = r#"
/// Guard elements on each side of every buffer: 1 KiB of f32, more than a vector store or a
/// small tile's row overruns by.
const GUARD: usize = 256;

trait Elem: ::harl::runtime::aligned::Scalar {
    const TAG: u8;
    const SIZE: usize;
    fn from_le(b: &[u8]) -> Self;
    fn to_f64(self) -> f64;
    fn bits(self) -> u64;
    /// What the output holds before the checked run: elements a kernel forgets stay wrong.
    /// NaNs with payloads arithmetic never makes (it yields the default NaN).
    fn sentinel() -> Self;
    /// The sentinel of the confirming run (an i32 output may equal the first by chance).
    fn sentinel2() -> Self;
    /// What surrounds every buffer.
    fn guard() -> Self;
}
impl Elem for f32 {
    const TAG: u8 = 0;
    const SIZE: usize = 4;
    fn from_le(b: &[u8]) -> Self { let mut a = [0u8; 4]; a.copy_from_slice(b); f32::from_le_bytes(a) }
    fn to_f64(self) -> f64 { self as f64 }
    fn bits(self) -> u64 { self.to_bits() as u64 }
    fn sentinel() -> Self { f32::from_bits(0x7fc0_5eed) }
    fn sentinel2() -> Self { f32::from_bits(0x7fc0_d00d) }
    fn guard() -> Self { f32::from_bits(0x7fc0_9a4d) }
}
impl Elem for f64 {
    const TAG: u8 = 1;
    const SIZE: usize = 8;
    fn from_le(b: &[u8]) -> Self { let mut a = [0u8; 8]; a.copy_from_slice(b); f64::from_le_bytes(a) }
    fn to_f64(self) -> f64 { self }
    fn bits(self) -> u64 { self.to_bits() }
    fn sentinel() -> Self { f64::from_bits(0x7ff8_0000_0000_5eed) }
    fn sentinel2() -> Self { f64::from_bits(0x7ff8_0000_0000_d00d) }
    fn guard() -> Self { f64::from_bits(0x7ff8_0000_0000_9a4d) }
}
impl Elem for i32 {
    const TAG: u8 = 2;
    const SIZE: usize = 4;
    fn from_le(b: &[u8]) -> Self { let mut a = [0u8; 4]; a.copy_from_slice(b); i32::from_le_bytes(a) }
    fn to_f64(self) -> f64 { self as f64 }
    fn bits(self) -> u64 { self as u32 as u64 }
    fn sentinel() -> Self { i32::MIN + 0x5eed }
    fn sentinel2() -> Self { i32::MAX - 0xd00d }
    fn guard() -> Self { i32::MIN + 0x9a4d }
}

/// A buffer of `len` elements between two runs of [`GUARD`] guard elements.
#[derive(Clone)]
struct Guarded<T: Elem> { buf: ::harl::runtime::AlignedBuf<T>, len: usize }
impl<T: Elem> Guarded<T> {
    fn filled(len: usize, v: T) -> Self {
        let mut buf = ::harl::runtime::AlignedBuf::filled(len + 2 * GUARD, T::guard());
        buf[GUARD..GUARD + len].fill(v);
        Guarded { buf, len }
    }
    fn inner(&self) -> &[T] { &self.buf[GUARD..GUARD + self.len] }
    fn inner_mut(&mut self) -> &mut [T] { &mut self.buf[GUARD..GUARD + self.len] }
    /// The guard elements that changed: how many, and the first (relative to the buffer).
    fn guards_broken(&self) -> Option<String> {
        let g = T::guard().bits();
        let before = (0..GUARD).filter(|&i| self.buf[i].bits() != g).map(|i| i as i64 - GUARD as i64);
        let after = (0..GUARD).filter(|&i| self.buf[GUARD + self.len + i].bits() != g).map(|i| (self.len + i) as i64);
        let broken: Vec<i64> = before.chain(after).collect();
        let first = *broken.first()?;
        Some(format!("{} guard elements changed, the first at index {first} of a buffer of {}", broken.len(), self.len))
    }
    /// Where this buffer (guards included) differs from `other`, bit for bit.
    fn diff(&self, other: &Self) -> Option<String> {
        if let Some(g) = self.guards_broken() { return Some(g); }
        let i = self.buf.iter().zip(other.buf.iter()).position(|(a, b)| a.bits() != b.bits())?;
        Some(format!("element {} changed", i - GUARD))
    }
}

struct Reader { buf: Vec<u8>, pos: usize }
impl Reader {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or("truncated data file")?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> { Ok(self.take(1)?[0]) }
    fn u64(&mut self) -> Result<u64, String> { let mut a = [0u8; 8]; a.copy_from_slice(self.take(8)?); Ok(u64::from_le_bytes(a)) }
    fn f64(&mut self) -> Result<f64, String> { Ok(f64::from_bits(self.u64()?)) }
    fn len(&mut self) -> Result<usize, String> { usize::try_from(self.u64()?).map_err(|e| e.to_string()) }
    fn tagged_len<T: Elem>(&mut self) -> Result<usize, String> {
        let tag = self.u8()?;
        if tag != T::TAG { return Err(format!("data file has element type {tag}, the kernel wants {}", T::TAG)); }
        self.len()
    }
    fn guarded<T: Elem>(&mut self) -> Result<Guarded<T>, String> {
        let n = self.tagged_len::<T>()?;
        let bytes = self.take(n.checked_mul(T::SIZE).ok_or("bad length")?)?;
        let mut g = Guarded::filled(n, T::guard());
        for (d, b) in g.inner_mut().iter_mut().zip(bytes.chunks_exact(T::SIZE)) { *d = T::from_le(b); }
        Ok(g)
    }
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// The body of a rejection.
fn wrong(msg: &str) -> String { format!("\"wrong\":{}", json_str(msg)) }

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> Result<T, String> {
    args.get(i).and_then(|a| a.parse().ok()).ok_or_else(|| format!("bad or missing argument {i} ({what})"))
}

fn main() {
    // The parent's nonce, read to the end of stdin before any kernel runs: the pipe is then
    // drained, so a kernel can neither read it again nor find it in argv or the environment.
    let mut nonce = String::new();
    if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut nonce) {
        eprintln!("worker: reading the nonce: {e}");
        std::process::exit(2);
    }
    let nonce = nonce.trim().to_string();
    let args: Vec<String> = std::env::args().collect();
    match real_main(&args) {
        Ok(body) => println!("{{\"nonce\":{},{body}}}", json_str(&nonce)),
        Err(e) => {
            eprintln!("worker: {e}");
            std::process::exit(2);
        }
    }
}

fn real_main(args: &[String]) -> Result<String, String> {
    if args.len() != 8 {
        return Err("usage: worker <candidate> <data file> <threads> <min_time_ms> <min_repeats> <warmup> <cutoff_s> < nonce".into());
    }
    let cand: usize = arg(args, 1, "candidate")?;
    let threads: usize = arg(args, 3, "threads")?;
    let min_time = std::time::Duration::from_millis(arg(args, 4, "min_time_ms")?);
    let min_repeats: usize = arg(args, 5, "min_repeats")?;
    let warmup: usize = arg(args, 6, "warmup")?;
    let cutoff: f64 = arg(args, 7, "cutoff_s")?;
    let kernel = *KERNELS.get(cand).ok_or_else(|| format!("no candidate {cand} in this worker"))?;
    let isa = match ::harl::runtime::Isa::detect() {
        ::harl::runtime::Isa::Avx512 => "avx512",
        ::harl::runtime::Isa::Avx2 => "avx2",
        _ => "base",
    };
    if isa != ISA {
        return Err(format!("this CPU dispatches to the {isa} variant, but the {ISA} variant was built"));
    }
    let bytes = std::fs::read(&args[2]).map_err(|e| format!("{}: {e}", args[2]))?;
    let mut r = Reader { buf: bytes, pos: 0 };
    if r.take(8)? != b"HARLMD2\0" { return Err("not a harl measure data file (version 2)".into()); }
    let inputs = read_inputs(&mut r)?;
    let out_len = r.tagged_len::<Out>()?;
    let tol = r.f64()?;
    let dense = r.u8()? == 1;
    let n = r.len()?;
    let mut points = Vec::with_capacity(n.min(out_len.saturating_add(2)));
    for k in 0..n {
        let i = if dense { k } else { r.len()? };
        points.push((i, r.f64()?));
    }
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().map_err(|e| e.to_string())?;
    // Bytes written between timed runs (`MeasureConfig::flush_bytes`); absent or bad: none.
    let flush = std::env::var("HARL_MEASURE_FLUSH_BYTES").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
    let timing = Timing { min_time, min_repeats, warmup, cutoff, flush };
    Ok(pool.install(|| measure(kernel, &inputs, out_len, tol, &points, &timing)))
}

struct Timing { min_time: std::time::Duration, min_repeats: usize, warmup: usize, cutoff: f64, flush: usize }

/// Everything wrong with the buffers after a run, if anything.
fn damage(inputs: &Inputs, pristine: &Inputs, out: &Guarded<Out>) -> Option<String> {
    // The compiler may assume memory behind `&Inputs` never changes (and so that it still
    // equals its clone): the buffers are read back through opaque references.
    let (inputs, out) = (std::hint::black_box(inputs), std::hint::black_box(out));
    if let Some(g) = out.guards_broken() {
        return Some(format!("the kernel wrote outside its output: {g}"));
    }
    inputs_changed(inputs, pristine).map(|d| format!("the kernel wrote to its inputs: {d}"))
}

fn measure(
    kernel: Kernel,
    inputs: &Inputs,
    out_len: usize,
    tol: f64,
    points: &[(usize, f64)],
    timing: &Timing,
) -> String {
    // The kernel gets `inputs`; this copy (guards included) tells whether it wrote to them.
    let pristine = inputs.clone();
    let mut out = Guarded::<Out>::filled(out_len, Out::sentinel());
    let t = std::time::Instant::now();
    let checked = call(kernel, inputs, out.inner_mut());
    let check_s = t.elapsed().as_secs_f64();
    if let Err(e) = checked {
        return wrong(&format!("the kernel returned an error: {e}"));
    }
    if let Some(d) = damage(inputs, &pristine, &out) {
        return wrong(&d);
    }
    let s1 = Out::sentinel().bits();
    let unset: Vec<usize> = out.inner().iter().enumerate().filter(|(_, v)| v.bits() == s1).map(|(i, _)| i).collect();
    if !unset.is_empty() {
        // Confirmed by a run with another sentinel: a computed value equals at most one.
        let mut again = Guarded::<Out>::filled(out_len, Out::sentinel2());
        let _ = call(kernel, inputs, again.inner_mut());
        let s2 = Out::sentinel2().bits();
        let still: Vec<usize> = unset.into_iter().filter(|&i| again.inner()[i].bits() == s2).collect();
        if let Some(first) = still.first() {
            return wrong(&format!("{} of {out_len} output elements were never written; first: element {first}", still.len()));
        }
    }
    let mut bad = 0usize;
    let mut first = None;
    let got_all = out.inner();
    for &(i, want) in points {
        let got = got_all.get(i).map_or(f64::NAN, |v| v.to_f64());
        // Equal values pass (infinities too); NaN compares false, so a NaN is wrong.
        if !(got == want || (got - want).abs() <= tol * (1.0 + want.abs())) {
            bad += 1;
            if first.is_none() {
                first = Some(format!("element {i}: got {got}, want {want}"));
            }
        }
    }
    if let Some(first) = first {
        return wrong(&format!("{bad} of {} checked elements differ (relative tolerance {tol:e}); first: {first}", points.len()));
    }
    // Far slower than the best already: no warm-up, and the first timed run is its
    // measurement. Never the checked run itself: a first call pays for preparing weights
    // (their layout, once per model load), first-touch page faults and the thread pool's
    // start, which no later call pays, so it ranked every candidate after the batch's
    // first by its weights' preparation.
    let slow = |s: f64| timing.cutoff > 0.0 && s > timing.cutoff;
    if !slow(check_s) {
        for _ in 0..timing.warmup {
            let _ = call(kernel, inputs, out.inner_mut());
        }
    }
    let mut times = Vec::new();
    let mut flush = vec![0u8; timing.flush];
    let mut timed = std::time::Duration::ZERO;
    let start = std::time::Instant::now();
    // With a flush, the time budget counts the timed runs only, so flushing does not cut
    // their number; a wall-clock cap of ten budgets keeps a tiny kernel behind a large flush
    // from running into the timeout.
    let more = |timed: std::time::Duration| if timing.flush > 0 {
        timed < timing.min_time && start.elapsed() < timing.min_time * 10
    } else {
        start.elapsed() < timing.min_time
    };
    while times.is_empty() || times.len() < timing.min_repeats || more(timed) {
        // One write a cache line evicts what the last run left warm (not timed).
        for (k, line) in flush.chunks_mut(64).enumerate() {
            line[0] = line[0].wrapping_add(k as u8 | 1);
        }
        std::hint::black_box(&mut flush);
        let t = std::time::Instant::now();
        let _ = call(kernel, inputs, out.inner_mut());
        let took = t.elapsed();
        timed += took;
        times.push(took.as_secs_f64());
        std::hint::black_box(&mut out);
        if times.len() == 1 && slow(times[0]) {
            break;
        }
    }
    // Damage done by a later run voids the timing too (checked after it: not timed).
    if let Some(d) = damage(inputs, &pristine, &out) {
        return wrong(&format!("after the timed runs: {d}"));
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let n = times.len();
    let median = if n % 2 == 1 { times[n / 2] } else { 0.5 * (times[n / 2 - 1] + times[n / 2]) };
    format!("\"median_s\":{median:e},\"min_s\":{:e},\"max_s\":{:e},\"runs\":{n}", times[0], times[n - 1])
}
"#;

/// The reference data file: inputs, then the output's type and length, the tolerance and the
/// checked points, as a flag (1: every element in order, values only; 0: index-value pairs),
/// a count and the points (all little-endian).
fn encode_data(graph: &Graph, r: &ReferenceData) -> Result<Vec<u8>, String> {
    fn tag(d: DType) -> Result<u8, String> {
        match d {
            DType::F32 => Ok(0),
            DType::F64 => Ok(1),
            DType::I32 => Ok(2),
            DType::Bool => Err("bool tensors cannot be measured".into()),
        }
    }
    let mut b = Vec::new();
    b.extend_from_slice(DATA_MAGIC);
    for (p, data) in graph.inputs.iter().zip(&r.inputs) {
        b.push(tag(p.dtype)?);
        b.extend_from_slice(&(data.len() as u64).to_le_bytes());
        for &v in data {
            match p.dtype {
                DType::F64 => b.extend_from_slice(&v.to_le_bytes()),
                DType::I32 => b.extend_from_slice(&(v as i32).to_le_bytes()),
                _ => b.extend_from_slice(&(v as f32).to_le_bytes()),
            }
        }
    }
    let last = graph.stages.last().ok_or("the graph has no stage")?;
    b.push(tag(last.dtype)?);
    b.extend_from_slice(&(last.size() as u64).to_le_bytes());
    b.extend_from_slice(&r.tolerance.to_le_bytes());
    let dense = r.points.len() == last.size() && r.points.iter().enumerate().all(|(k, &p)| k == p);
    b.push(u8::from(dense));
    b.extend_from_slice(&(r.points.len() as u64).to_le_bytes());
    for (&p, &v) in r.points.iter().zip(&r.expected) {
        if !dense {
            b.extend_from_slice(&(p as u64).to_le_bytes());
        }
        b.extend_from_slice(&v.to_le_bytes());
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worker's source reads the flush size under the name the measurer sets.
    #[test]
    fn the_worker_reads_the_flush_variable_the_measurer_sets() {
        assert!(WORKER_HARNESS.contains(&format!("std::env::var(\"{FLUSH_ENV}\")")));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_timed_out_build_group_dies_with_its_children() {
        use std::io::BufRead;
        // A "build" whose child (like rustc under cargo) outlives a kill of the parent alone.
        let mut command = Command::new("sh");
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command
            .args(["-c", "sleep 30 & echo $!; wait"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("sh runs");
        let mut line = String::new();
        let out = child.stdout.take().expect("piped");
        io::BufReader::new(out)
            .read_line(&mut line)
            .expect("pid line");
        let grandchild: u32 = line.trim().parse().expect("a pid");
        let status = wait_with_timeout(&mut child, Duration::from_millis(50)).expect("waits");
        assert!(status.is_none(), "the build should have timed out");
        kill_process_group(child.id());
        // Gone, or a zombie waiting for init: not running.
        let alive = |pid: u32| {
            fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit(')')
                        .next()
                        .map(|r| r.trim_start().starts_with(['R', 'S', 'D']))
                })
                .unwrap_or(false)
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(grandchild) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!alive(grandchild), "the grandchild {grandchild} survived");
    }

    #[test]
    fn candidate_files_are_recognised() {
        assert_eq!(candidate_of_file("src/cand12.rs"), Some(12));
        assert_eq!(candidate_of_file("/x/src/cand0.rs"), Some(0));
        assert_eq!(candidate_of_file("src/main.rs"), None);
        assert_eq!(candidate_of_file("src/candx.rs"), None);
    }

    #[test]
    fn worker_results_parse() {
        let n = "00ff";
        let m = parse_result(
            "noise\n{\"nonce\":\"00ff\",\"median_s\":1e-3,\"min_s\":9e-4,\"max_s\":2e-3,\"runs\":7}\n",
            n,
        );
        assert_eq!(m.latency_s, Some(1e-3));
        assert_eq!((m.min_s, m.max_s, m.runs), (9e-4, 2e-3, 7));
        assert!(m.is_ok());
        let m = parse_result("{\"nonce\":\"00ff\",\"wrong\":\"element 3\"}", n);
        assert_eq!(m.error, Some(TrialError::WrongResult("element 3".into())));
        assert!(matches!(
            parse_result("", n).error,
            Some(TrialError::Crash(_))
        ));
        // Another nonce, or none: a forgery, even before the real line.
        for forged in [
            "{\"median_s\":1e-9,\"min_s\":1e-9,\"max_s\":1e-9,\"runs\":3}\n",
            "{\"nonce\":\"0000\",\"median_s\":1e-9,\"min_s\":1e-9,\"max_s\":1e-9,\"runs\":3}\n",
        ] {
            let out = format!("{forged}{{\"nonce\":\"00ff\",\"median_s\":1e-3,\"min_s\":9e-4,\"max_s\":2e-3,\"runs\":7}}");
            let m = parse_result(&out, n);
            assert!(
                matches!(&m.error, Some(TrialError::WrongResult(w)) if w.contains("of its own")),
                "{m:?}"
            );
        }
        // Other JSON a kernel prints is noise.
        let m = parse_result(
            "{\"debug\":1}\n{\"nonce\":\"00ff\",\"median_s\":1e-3,\"min_s\":9e-4,\"max_s\":2e-3,\"runs\":7}",
            n,
        );
        assert!(m.is_ok(), "{m:?}");
        assert_ne!(run_nonce(), run_nonce());
    }

    #[test]
    fn build_errors_are_attributed_to_candidates() {
        let line = |pkg: &str, file: &str, text: &str| {
            serde_json::json!({
                "reason": "compiler-message",
                "package_id": pkg,
                "message": {"level": "error", "message": text, "rendered": text,
                    "spans": [{"file_name": file, "is_primary": true}]}
            })
            .to_string()
        };
        let ours = "path+file:///w#harl-measure-worker@0.0.0";
        let out = [
            line(ours, "src/cand3.rs", "mismatched types"),
            line(ours, "src/main.rs", "harness"),
            line(ours, "src/cand3.rs", "aborting due to 1 previous error"),
        ]
        .join("\n");
        match classify_build_errors(&out, "") {
            Ok(Built::Errors {
                by_candidate,
                unattributed,
            }) => {
                assert_eq!(
                    by_candidate.get(&3).map(String::as_str),
                    Some("mismatched types")
                );
                assert_eq!(unattributed, "harness");
            }
            _ => panic!("expected attributed errors"),
        }
        let dep = line("registry+https://x#rayon@1.0.0", "src/lib.rs", "boom");
        assert!(classify_build_errors(&dep, "").is_err());
        assert!(classify_build_errors("", "error: no matching package").is_err());
    }

    #[test]
    fn reference_is_reproducible() {
        let g = harl_te::ops::workloads::matmul(8, 16, 8).expect("matmul");
        let a = reference_data(&g, 5, 10).expect("reference");
        assert_eq!(a, reference_data(&g, 5, 10).expect("reference"));
        assert_ne!(
            a.inputs,
            reference_data(&g, 6, 10).expect("reference").inputs
        );
        // Small outputs are checked in full, whatever `check_points` says.
        assert_eq!(a.points, (0..64).collect::<Vec<_>>());
        assert!((a.tolerance - 16e-5).abs() < 1e-12);
        // Above FULL_CHECK_MAX: random points, the first and the last among them.
        let big = harl_te::ops::workloads::matmul(1025, 1, 1024).expect("matmul");
        // Small output, but a long reduction: random points too.
        let deep = harl_te::ops::workloads::matmul(32, 1 << 17, 32).expect("matmul");
        let d = reference_data(&deep, 5, 10).expect("reference");
        assert!(d.points.len() <= 10);
        let r = reference_data(&big, 5, 10).expect("reference");
        assert!(r.points.len() <= 10 && r.points[0] == 0);
        assert_eq!(r.points.last(), Some(&(1025 * 1024 - 1)));
    }

    #[test]
    fn reference_inputs_have_both_signs_large_values_and_signed_slices() {
        let g = harl_te::ops::workloads::matmul(64, 64, 64).expect("matmul");
        let r = reference_data(&g, 3, 64).expect("reference");
        let a = &r.inputs[0];
        assert!(a.iter().any(|&v| v < 0.0) && a.iter().any(|&v| v > 0.0));
        assert!(a.iter().any(|&v| v.abs() > 4.0));
        assert!(a.iter().all(|&v| v.abs() < 16.0));
        // Some row of the first input is all of one sign, and some of the second.
        let one_sign = |rows: &[f64], neg: bool| {
            rows.chunks(64)
                .any(|row| row.iter().all(|&v| if neg { v <= 0.0 } else { v >= 0.0 }))
        };
        assert!(one_sign(a, true));
        assert!(one_sign(&r.inputs[1], false));
        // An integer graph is checked exactly.
        let mut b = harl_te::GraphBuilder::new();
        let x = b.input("x", &[4, 8], DType::I32);
        let body = harl_te::load(x, [harl_te::Expr::axis(0), harl_te::Expr::axis(1)]);
        b.reduce("s", &[4], DType::I32, ReduceOp::Sum, &[8], body);
        let ig = b.finish().expect("graph");
        let r = reference_data(&ig, 3, 64).expect("reference");
        assert_eq!(r.tolerance, 0.0);
        assert!(r.inputs[0].iter().all(|&v| v != 0.0 && v.abs() <= 8.0));
    }
}
