//! The `build.rs` entry point: find kernels, pick schedules, write generated Rust to `OUT_DIR`.
//!
//! ```no_run
//! // build.rs: fn main() { ... }
//! harl_build::Builder::new().scan_crate().compile();
//! ```
//! Kernels declared with `#[harl::kernel]` are found by scanning the crate's sources; ops can
//! also be registered directly with [`Builder::kernel`] and included with
//! `harl::include_kernels!()`.

use crate::cache::{LookupSource, Record, TuningCache};
use crate::codegen::{emit_module, KernelMeta, Variant, VariantProgram};
use crate::default_schedule::default_schedule;
use crate::directive::{escape, Directives};
use crate::limits::MAX_SOURCE_BYTES;
use crate::loop_ir::Program;
use crate::lower::lower;
use crate::manifest::{Manifest, ManifestKernel, TuneOutcome, MANIFEST_FILE, MANIFEST_VERSION};
use crate::scan;
use crate::schedule::Schedule;
use crate::target::TargetFingerprint;
use crate::tuner_tool::{find_tuner, run_tuner, TUNER_BIN};
use harl_te::Graph;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// How much tuning a build may do (`HARL_TUNE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TuneMode {
    /// Default schedules only; the cache is not read.
    Off,
    /// Use cache records; never tune (the default).
    Cache,
    /// Tune cache misses within the budget.
    On,
}

impl TuneMode {
    /// Parses `off`, `cache` or `on`.
    pub fn parse(s: &str) -> Option<TuneMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "0" | "false" => Some(TuneMode::Off),
            "cache" => Some(TuneMode::Cache),
            "on" | "1" | "true" => Some(TuneMode::On),
            _ => None,
        }
    }
}

/// Why a build step failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A variable cargo sets for build scripts is missing (not running under cargo?).
    #[error(
        "environment variable {0} is not set; run from a build script or set Builder::out_dir"
    )]
    MissingEnv(&'static str),
    /// Reading sources or writing generated code failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A kernel registered with [`Builder::kernel`] is invalid.
    #[error("kernel `{name}`: {why}")]
    InvalidKernel {
        /// Its name.
        name: String,
        /// What is wrong.
        why: String,
    },
}

/// Where the schedule of a generated kernel came from.
#[derive(Clone, Debug, PartialEq)]
pub enum ScheduleSource {
    /// The default heuristic.
    Default,
    /// A cache record for this exact target.
    CacheExact {
        /// Measured latency of the record.
        latency_s: f64,
    },
    /// A cache record from a CPU of the same ISA class.
    CacheCompatible {
        /// Measured latency of the record.
        latency_s: f64,
    },
    /// Tuned by this build (`HARL_TUNE=on`) and appended to the cache.
    Tuned {
        /// Measured latency of the winner.
        latency_s: f64,
        /// Trials spent.
        trials: usize,
    },
}

impl std::fmt::Display for ScheduleSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScheduleSource::Default => write!(f, "default schedule"),
            ScheduleSource::CacheExact { latency_s } => {
                write!(f, "tuning cache, exact target (recorded {latency_s:.3e} s)")
            }
            ScheduleSource::CacheCompatible { latency_s } => {
                write!(
                    f,
                    "tuning cache, same ISA class (recorded {latency_s:.3e} s)"
                )
            }
            ScheduleSource::Tuned { latency_s, trials } => {
                write!(
                    f,
                    "tuned by this build ({trials} trials, measured {latency_s:.3e} s)"
                )
            }
        }
    }
}

/// One generated kernel.
#[derive(Clone, Debug)]
pub struct KernelReport {
    /// Kernel name.
    pub name: String,
    /// Workload key.
    pub workload_key: String,
    /// Where its schedule came from.
    pub source: ScheduleSource,
    /// The generated file.
    pub path: PathBuf,
}

/// What a build generated, and the warnings it gave.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Every generated kernel.
    pub kernels: Vec<KernelReport>,
    /// Warnings (already printed as `cargo:warning` when running under cargo).
    pub warnings: Vec<String>,
}

struct Registered {
    name: String,
    graph: Graph,
}

/// Configures and runs harl's build step.
#[derive(Default)]
pub struct Builder {
    scan: Vec<PathBuf>,
    kernels: Vec<Registered>,
    out_dir: Option<PathBuf>,
    cache_dir: Option<PathBuf>,
    mode: Option<TuneMode>,
    quiet: bool,
    cuda: bool,
}

impl Builder {
    /// A builder with nothing registered.
    pub fn new() -> Self {
        Self::default()
    }

    /// Scans the crate's `src/` for `#[harl::kernel]` items.
    pub fn scan_crate(mut self) -> Self {
        let root = std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| PathBuf::from("."), PathBuf::from);
        self.scan.push(root.join("src"));
        self
    }

    /// Scans a file or directory for `#[harl::kernel]` items.
    pub fn scan_path(mut self, path: impl AsRef<Path>) -> Self {
        self.scan.push(path.as_ref().to_path_buf());
        self
    }

    /// Registers an op built with `harl_te` (e.g. `harl_te::ops::workloads::matmul(512, 512, 512)`)
    /// as module `name` of the file `harl::include_kernels!()` includes.
    pub fn kernel(mut self, name: &str, graph: Graph) -> Self {
        self.kernels.push(Registered {
            name: name.to_string(),
            graph,
        });
        self
    }

    /// Writes generated code here instead of `$OUT_DIR`.
    pub fn out_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.out_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// Reads tuning records from here (default `$CARGO_MANIFEST_DIR/tuning-cache`;
    /// `HARL_CACHE_DIR` overrides both).
    pub fn cache_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.cache_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// Sets the tuning mode (`HARL_TUNE` overrides it).
    pub fn tune(mut self, mode: TuneMode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// Also generates GPU code: each kernel module gets a `GPU: harl::gpu::GpuKernel` with PTX
    /// of the default GPU schedule (the user's crate enables harl's `cuda` feature). PTX needs
    /// NVRTC on the build host, through harl-build's `cuda` feature; without it the kernel is
    /// still generated, with no PTX, and says so at run time ([`harl::gpu`] docs) and here in
    /// a warning. GPU code is f32-only for now.
    pub fn cuda(mut self, on: bool) -> Self {
        self.cuda = on;
        self
    }

    /// Does not print `cargo:` lines (for use outside build scripts and in tests).
    pub fn quiet(mut self) -> Self {
        self.quiet = true;
        self
    }

    /// Runs the build step; on error prints it and fails the build script.
    pub fn compile(self) -> Report {
        match self.try_compile() {
            Ok(r) => r,
            Err(e) => {
                // Errors quote paths and names; keep them to one line each.
                eprintln!("harl-build: {}", escape(&e.to_string()));
                std::process::exit(1);
            }
        }
    }

    /// Runs the build step and returns a typed error instead of exiting.
    pub fn try_compile(self) -> Result<Report, BuildError> {
        let mut report = Report::default();
        let out_dir = match &self.out_dir {
            Some(d) => d.clone(),
            None => std::env::var_os("OUT_DIR")
                .map(PathBuf::from)
                .ok_or(BuildError::MissingEnv("OUT_DIR"))?,
        };
        let gen_dir = out_dir.join("harl");
        let env = BuildEnv::read(&self, &gen_dir);
        std::fs::create_dir_all(&gen_dir).map_err(|source| BuildError::Io {
            path: gen_dir.clone(),
            source,
        })?;
        let out = Directives::new(self.quiet);
        // Warnings quote cache files, paths and compiler messages: escaped once, here, both
        // for cargo and for the report (a build script that prints it stays safe).
        let warn = |msg: String, report: &mut Report| {
            out.warning(&msg);
            report.warnings.push(escape(&msg));
        };
        for var in [
            "HARL_TUNE",
            "HARL_CACHE_DIR",
            "HARL_TRIALS",
            "HARL_SEED",
            "HARL_STRATEGY",
            "HARL_TUNE_SECONDS",
            "HARL_GPU_TRIALS",
            "HARL_TUNER",
        ] {
            out.rerun_if_env_changed(var);
        }
        if self.cuda {
            // Where NVRTC is found.
            out.rerun_if_env_changed("LD_LIBRARY_PATH");
        }
        for p in self.scan.iter().chain(std::iter::once(&env.cache_dir)) {
            if p.exists() && !out.rerun_if_changed(p) {
                warn(
                    format!(
                        "{} has a line break or is not UTF-8, so cargo cannot watch it; rebuild by hand after changing it",
                        p.display()
                    ),
                    &mut report,
                );
            }
        }
        // Kernels declared with the attribute (one file each, named by name and workload key),
        // then kernels registered directly (modules of one file).
        let mut found = Vec::new();
        for root in &self.scan {
            scan::scan_path(root, &mut found)
                .map_err(|(path, source)| BuildError::Io { path, source })?;
        }
        for k in &self.kernels {
            if !is_ident(&k.name) {
                return Err(BuildError::InvalidKernel {
                    name: k.name.clone(),
                    why: "the name must be a Rust identifier".into(),
                });
            }
            k.graph.validate().map_err(|e| BuildError::InvalidKernel {
                name: k.name.clone(),
                why: e.to_string(),
            })?;
        }
        let kernels: Vec<(&str, &Graph)> = found
            .iter()
            .map(|d| (d.name.as_str(), &d.graph))
            .chain(self.kernels.iter().map(|k| (k.name.as_str(), &k.graph)))
            .collect();
        let manifest_path = gen_dir.join(MANIFEST_FILE);
        if let Err(e) = self
            .manifest(&kernels, &env, &gen_dir)
            .write(&manifest_path)
        {
            warn(
                format!("cannot write {}: {e}", manifest_path.display()),
                &mut report,
            );
        }
        let tuned = if env.mode == TuneMode::On && self.needs_tuning(&kernels, &env) {
            self.call_tuner(&manifest_path, &gen_dir, &mut |m| warn(m, &mut report))
        } else {
            HashMap::new()
        };
        for decl in &found {
            let params = param_names(decl.params.iter().map(|p| p.name.as_str()));
            let (code, source, key) =
                self.generate(&decl.name, &decl.graph, params, &env, &tuned, &mut |m| {
                    warn(m, &mut report)
                });
            let path = gen_dir.join(decl.generated_file());
            write_if_changed(&path, &code)?;
            report.kernels.push(KernelReport {
                name: decl.name.clone(),
                workload_key: key,
                source,
                path,
            });
        }
        let mut all =
            String::from("// @generated by harl-build: kernels registered with Builder::kernel.\n");
        for k in &self.kernels {
            let params = param_names(k.graph.inputs.iter().map(|p| p.name.as_str()));
            let (code, source, key) =
                self.generate(&k.name, &k.graph, params, &env, &tuned, &mut |m| {
                    warn(m, &mut report)
                });
            all.push_str(&format!(
                "/// Kernel `{}` ({source}).\n#[allow(warnings, clippy::all, unsafe_code, missing_docs)]\npub mod {} {{\n{code}}}\n",
                k.name, k.name
            ));
            report.kernels.push(KernelReport {
                name: k.name.clone(),
                workload_key: key,
                source,
                path: gen_dir.join("kernels.rs"),
            });
        }
        write_if_changed(&gen_dir.join("kernels.rs"), &all)?;
        Ok(report)
    }

    /// Picks each ISA variant's schedule (cache record or default) and emits the module; never
    /// fails: a bad record is a warning and the default schedule. Returns the code, the source
    /// of the variant this build host runs, and the workload key.
    fn generate(
        &self,
        name: &str,
        graph: &Graph,
        params: Vec<String>,
        env: &BuildEnv,
        tuned: &HashMap<String, TuneOutcome>,
        warn: &mut dyn FnMut(String),
    ) -> (String, ScheduleSource, String) {
        let key = graph.workload_key();
        let arch = env.target.arch.clone();
        let mut variants = Vec::new();
        let mut host_source = ScheduleSource::Default;
        for variant in Variant::ALL {
            let class = variant.isa_class(&arch);
            let fingerprint = if class == env.target.isa_class {
                env.target.clone()
            } else {
                TargetFingerprint {
                    arch: arch.clone(),
                    isa_class: class.clone(),
                    features: vec![],
                    cpu_model: "unknown".into(),
                    cores: env.target.cores,
                }
            };
            let cpu = variant.cpu_target(&arch, env.threads);
            let mut picked = self.pick_schedule(name, graph, &key, &fingerprint, env, warn);
            if let (
                Some(Picked {
                    source: source @ ScheduleSource::CacheExact { .. },
                    ..
                }),
                Some(t),
            ) = (picked.as_mut(), tuned.get(name))
            {
                if class == env.target.isa_class && t.trials > 0 {
                    *source = ScheduleSource::Tuned {
                        latency_s: t.latency_s.unwrap_or(f64::NAN),
                        trials: t.trials,
                    };
                }
            }
            let (lowered, source) = match picked {
                Some(p) => (Ok(p.program), p.source),
                None => (
                    lower(graph, &default_schedule(graph, &cpu)),
                    ScheduleSource::Default,
                ),
            };
            let program = match lowered {
                Ok(p) => p,
                Err(e) => {
                    // The default heuristic should always lower; if it does not, stay correct.
                    warn(format!(
                        "kernel `{name}` ({}): schedule rejected ({e}); using a plain loop nest",
                        variant.name()
                    ));
                    match lower(graph, &Schedule::naive()) {
                        Ok(p) => p,
                        Err(e) => {
                            warn(format!("kernel `{name}` cannot be lowered: {e}"));
                            return (String::new(), source, key);
                        }
                    }
                }
            };
            if class == env.target.isa_class {
                host_source = source.clone();
            }
            variants.push(VariantProgram {
                variant,
                program,
                source: source.to_string(),
            });
        }
        let meta = KernelMeta {
            name: name.to_string(),
            params,
            // The generated `run`'s output parameter ([`param_names`] keeps inputs off it).
            output: "out".into(),
        };
        let mut code = emit_module(graph, &variants, &meta);
        if code.len() > MAX_SOURCE_BYTES {
            warn(format!(
                "kernel `{name}`: its schedules emit {} bytes of Rust, over the limit of {MAX_SOURCE_BYTES}; using plain loop nests",
                code.len()
            ));
            if let Ok(plain) = lower(graph, &Schedule::naive()) {
                host_source = ScheduleSource::Default;
                for v in &mut variants {
                    v.program = plain.clone();
                    v.source = ScheduleSource::Default.to_string();
                }
                code = emit_module(graph, &variants, &meta);
            }
        }
        if self.cuda {
            let tuned = if env.mode == TuneMode::Off {
                Vec::new()
            } else {
                gpu_records(name, graph, &key, &env.cache_dir, warn)
            };
            code.push_str(&gpu_item(name, graph, &tuned, warn));
        }
        (code, host_source, key)
    }

    /// The build's kernels as `cargo harl tune` reads them.
    fn manifest(&self, kernels: &[(&str, &Graph)], env: &BuildEnv, gen_dir: &Path) -> Manifest {
        Manifest {
            version: MANIFEST_VERSION,
            package: std::env::var("CARGO_PKG_NAME").unwrap_or_default(),
            manifest_dir: std::env::var_os("CARGO_MANIFEST_DIR")
                .map_or_else(|| PathBuf::from("."), PathBuf::from),
            cache_dir: env.cache_dir.clone(),
            local_cache: env.local_cache.clone(),
            gen_dir: gen_dir.to_path_buf(),
            harl_root: std::env::var_os("DEP_HARL_ROOT").map(PathBuf::from),
            target: env.target.clone(),
            threads: env.threads,
            cuda: self.cuda,
            kernels: kernels
                .iter()
                .map(|(name, graph)| ManifestKernel {
                    name: name.to_string(),
                    workload_key: graph.workload_key(),
                    graph: (*graph).clone(),
                })
                .collect(),
        }
    }

    /// Whether some kernel lacks a usable record for exactly this CPU (GPU kernels are always
    /// handed to the tuner, which knows the device).
    fn needs_tuning(&self, kernels: &[(&str, &Graph)], env: &BuildEnv) -> bool {
        self.cuda
            || kernels.iter().any(|(name, graph)| {
                let key = graph.workload_key();
                !matches!(
                    self.pick_schedule(name, graph, &key, &env.target, env, &mut |_| {}),
                    Some(Picked {
                        source: ScheduleSource::CacheExact { .. },
                        ..
                    })
                )
            })
    }

    /// Hands the manifest to the installed tuner and turns what it did into warnings; returns
    /// the kernels it tuned, by name.
    fn call_tuner(
        &self,
        manifest: &Path,
        gen_dir: &Path,
        warn: &mut dyn FnMut(String),
    ) -> HashMap<String, TuneOutcome> {
        let Some(tuner) = find_tuner() else {
            warn(
                "HARL_TUNE=on, but the tuner is not installed, so kernels use cached or default schedules; install it once with `cargo install cargo-harl` (or `--path` to harl's `cargo-harl/`), or name it with HARL_TUNER; then `cargo harl tune` also tunes outside a build".into(),
            );
            return HashMap::new();
        };
        let log = gen_dir.join("tune.log");
        let outcomes = match run_tuner(&tuner, manifest, &gen_dir.join("tune-results.json"), &log) {
            Ok(o) => o,
            Err(e) => {
                warn(format!(
                    "{TUNER_BIN} could not tune this crate's kernels ({e}); they use cached or default schedules"
                ));
                return HashMap::new();
            }
        };
        for o in &outcomes {
            if o.latency_s.is_none() {
                let why = o.note.as_deref().unwrap_or("every trial failed");
                warn(format!("kernel `{}`: {why}", o.name));
                continue;
            }
            let latency =
                |l: Option<f64>| l.map_or("failed".into(), |l| format!("{:.4} ms", l * 1e3));
            let mut line = format!(
                "tuned `{}`: {} trials in {:.0} s, best {} (default schedule {})",
                o.name,
                o.trials,
                o.wall_s,
                latency(o.latency_s),
                latency(o.default_latency_s)
            );
            if let Some(path) = &o.recorded_in {
                line.push_str(&format!(
                    "; recorded in {} (commit it so your users get this kernel without tuning)",
                    path.display()
                ));
            }
            if let Some(note) = &o.note {
                line.push_str(&format!("; {note}"));
            }
            warn(line);
        }
        if !outcomes.is_empty() {
            warn(format!("the tuner's log: {}", log.display()));
        }
        outcomes.into_iter().map(|o| (o.name.clone(), o)).collect()
    }

    /// The best valid cache record for one ISA class, if tuning records are in use.
    fn pick_schedule(
        &self,
        name: &str,
        graph: &Graph,
        key: &str,
        fingerprint: &TargetFingerprint,
        env: &BuildEnv,
        warn: &mut dyn FnMut(String),
    ) -> Option<Picked> {
        if env.mode == TuneMode::Off {
            return None;
        }
        // Validating a record is lowering it: the program of the record a lookup accepts (its
        // last successful validation, since a lookup stops there) is kept, not lowered again.
        let (shared, local_kept) = Default::default();
        let mut lookup =
            TuningCache::new(&env.cache_dir).lookup(key, fingerprint, keep_program(graph, &shared));
        let mut program = shared.into_inner();
        for w in std::mem::take(&mut lookup.warnings) {
            warn(format!(
                "kernel `{name}`: ignoring a tuning record ({w}); using the next best"
            ));
        }
        if lookup.source != LookupSource::Exact && env.mode == TuneMode::On {
            // What an earlier build tuned but could not record in a read-only cache.
            let local = TuningCache::new(&env.local_cache).lookup(
                key,
                fingerprint,
                keep_program(graph, &local_kept),
            );
            if local.source == LookupSource::Exact {
                lookup = local;
                program = local_kept.into_inner();
            }
        }
        let r = lookup.record?;
        let source = match lookup.source {
            LookupSource::Exact => ScheduleSource::CacheExact {
                latency_s: r.latency_s,
            },
            _ => ScheduleSource::CacheCompatible {
                latency_s: r.latency_s,
            },
        };
        Some(Picked {
            source,
            program: program?,
        })
    }
}

/// A record validator that lowers the record's schedule and keeps the program.
fn keep_program<'a>(
    graph: &'a Graph,
    kept: &'a std::cell::RefCell<Option<Program>>,
) -> impl Fn(&Record) -> Result<(), String> + 'a {
    move |r| {
        let program = lower(graph, &r.schedule).map_err(|e| e.to_string())?;
        *kept.borrow_mut() = Some(program);
        Ok(())
    }
}

/// A schedule taken from the cache, with its program (lowered once, when it was validated).
struct Picked {
    source: ScheduleSource,
    program: Program,
}

/// What the environment says about this build.
struct BuildEnv {
    mode: TuneMode,
    cache_dir: PathBuf,
    /// Records tuned by this crate's earlier builds that the cache directory refused.
    local_cache: PathBuf,
    target: TargetFingerprint,
    /// Threads the default schedules plan parallel work for.
    threads: usize,
}

impl BuildEnv {
    fn read(b: &Builder, gen_dir: &Path) -> BuildEnv {
        let env_mode = std::env::var("HARL_TUNE")
            .ok()
            .and_then(|v| TuneMode::parse(&v));
        let mut mode = env_mode.or(b.mode).unwrap_or(TuneMode::Cache);
        let host = std::env::var("HOST").ok();
        let target = std::env::var("TARGET").ok();
        let cross = matches!((&host, &target), (Some(h), Some(t)) if h != t);
        if std::env::var_os("DOCS_RS").is_some() {
            mode = TuneMode::Off;
        }
        if cross && mode == TuneMode::On {
            mode = TuneMode::Cache;
        }
        let cache_dir = std::env::var_os("HARL_CACHE_DIR")
            .map(PathBuf::from)
            .or_else(|| b.cache_dir.clone())
            .unwrap_or_else(|| {
                std::env::var_os("CARGO_MANIFEST_DIR")
                    .map_or_else(|| PathBuf::from("."), PathBuf::from)
                    .join("tuning-cache")
            });
        let (fingerprint, threads) = match (&target, cross) {
            (Some(t), true) => (TargetFingerprint::for_target_triple(t), 4),
            _ => {
                let fp = TargetFingerprint::host();
                let threads = fp.cores.max(1);
                (fp, threads)
            }
        };
        if mode == TuneMode::On && is_third_party(&cache_dir) {
            // Someone else's crate: its build must not tune (minutes in every dependent's
            // build) nor write into the registry, whatever HARL_TUNE says.
            mode = TuneMode::Cache;
        }
        BuildEnv {
            mode,
            cache_dir,
            local_cache: gen_dir.join("tuned"),
            target: fingerprint,
            threads,
        }
    }
}

/// Whether this build belongs to a crate the user does not own: one unpacked from a registry
/// or checked out by cargo (under `CARGO_HOME`), or vendored (`cargo vendor` writes
/// `.cargo-checksum.json`); or whether its cache directory lies under `CARGO_HOME`.
fn is_third_party(cache_dir: &Path) -> bool {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let canonical = |p: &Path| {
        // A path that does not exist yet (a cache dir to create) is compared through its
        // nearest existing ancestor.
        let mut p = p.to_path_buf();
        let mut tail = Vec::new();
        loop {
            if let Ok(c) = p.canonicalize() {
                return tail
                    .into_iter()
                    .rev()
                    .fold(c, |acc: PathBuf, t| acc.join(t));
            }
            match (p.file_name().map(|f| f.to_os_string()), p.parent()) {
                (Some(f), Some(parent)) => {
                    tail.push(f);
                    p = parent.to_path_buf();
                }
                _ => return p,
            }
        }
    };
    let under_home = |p: &Path| {
        cargo_home
            .as_deref()
            .is_some_and(|home| canonical(p).starts_with(canonical(home)))
    };
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    manifest.as_deref().is_some_and(|m| {
        under_home(m) || m.join(".cargo-ok").exists() || m.join(".cargo-checksum.json").exists()
    }) || under_home(cache_dir)
}

fn write_if_changed(path: &Path, content: &str) -> Result<(), BuildError> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == content) {
        return Ok(());
    }
    std::fs::write(path, content).map_err(|source| BuildError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && syn::parse_str::<syn::Ident>(s).is_ok()
}

/// The generated `run`'s parameter names: each input's own name where it is a plain Rust
/// identifier (not a keyword, not `out`, not taken by an earlier input), else `input{i}`.
/// The output is `out`; callers pass arguments by position, so names only help a reader.
fn param_names<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let names: Vec<&str> = names.collect();
    let mut params: Vec<String> = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let plain = is_ident(name) && *name != "out" && !name.starts_with("input");
        let unique = !names[..i].contains(name);
        params.push(if plain && unique {
            name.to_string()
        } else {
            format!("input{i}")
        });
    }
    params
}

/// The compute capability the default GPU program's PTX targets (the driver JIT-compiles it for
/// any newer device).
const DEFAULT_PTX_CC: u32 = 70;

/// The best GPU record of the workload for each compute capability the cache has a file for
/// (`cuda-sm_XY.jsonl`), checked to lower and to bind blocks; bad records are warnings.
fn gpu_records(
    name: &str,
    graph: &Graph,
    key: &str,
    cache_dir: &Path,
    warn: &mut dyn FnMut(String),
) -> Vec<((u32, u32), Schedule)> {
    let Ok(entries) = std::fs::read_dir(cache_dir) else {
        return Vec::new();
    };
    let mut classes: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".jsonl")
                .map(String::from)
        })
        .filter(|c| crate::target::cuda_capability(c).is_some())
        .collect();
    classes.sort();
    let cache = TuningCache::new(cache_dir);
    let mut out = Vec::new();
    for class in classes {
        let Some(cc) = crate::target::cuda_capability(&class) else {
            continue;
        };
        let probe = TargetFingerprint {
            arch: "cuda".into(),
            isa_class: class,
            features: vec![],
            cpu_model: "unknown".into(),
            cores: 1,
        };
        let lookup = cache.lookup(key, &probe, |r| {
            let bound = r
                .schedule
                .steps
                .iter()
                .any(|s| matches!(s, crate::schedule::Step::BindBlock { .. }));
            if !bound {
                return Err("not a GPU schedule".into());
            }
            lower(graph, &r.schedule)
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        for w in lookup.warnings {
            warn(format!(
                "kernel `{name}`: ignoring a GPU tuning record ({w})"
            ));
        }
        if let Some(r) = lookup.record {
            out.push((cc, r.schedule));
        }
    }
    out
}

/// The `GPU` item of a kernel module: its PTX programs (tuned ones first, then the default)
/// and launch plans.
fn gpu_item(
    name: &str,
    graph: &Graph,
    tuned: &[((u32, u32), Schedule)],
    warn: &mut dyn FnMut(String),
) -> String {
    let sizes: Vec<usize> = graph
        .inputs
        .iter()
        .map(|t| t.shape.iter().product())
        .collect();
    let output = graph.stages.last().map_or(0, |s| s.size());
    let mut programs = Vec::new();
    for (cc, schedule) in tuned {
        match gpu_program(graph, schedule, Some(*cc)) {
            Ok(p) => programs.push(p),
            Err(why) => warn(format!(
                "kernel `{name}`: no tuned GPU code for sm_{}{}: {why}",
                cc.0, cc.1
            )),
        }
    }
    let default = crate::gpu_sketch::GpuSketch::new(graph)
        .ok_or_else(|| "invalid graph".to_string())
        .and_then(|sk| {
            sk.to_schedule(&sk.default_params())
                .map_err(|e| e.to_string())
        })
        .and_then(|s| gpu_program(graph, &s, None));
    match default {
        Ok(p) => programs.push(p),
        Err(why) => warn(format!("kernel `{name}`: no GPU code: {why}")),
    }
    let programs = programs.join(", ");
    format!(
        "\n/// GPU code of this kernel: see `harl::gpu`.\npub static GPU: ::harl::gpu::GpuKernel = ::harl::gpu::GpuKernel {{ name: {name:?}, inputs: &{sizes:?}, output: {output}, programs: &[{programs}] }};\n"
    )
}

/// A GPU schedule's program as a `harl::gpu::GpuProgram` expression: PTX for `tuned_for`'s
/// compute capability, or for [`DEFAULT_PTX_CC`] (any newer device) when `None`.
fn gpu_program(
    graph: &Graph,
    schedule: &Schedule,
    tuned_for: Option<(u32, u32)>,
) -> Result<String, String> {
    let f32_only = graph
        .inputs
        .iter()
        .map(|t| t.dtype)
        .chain(graph.stages.iter().map(|s| s.dtype))
        .all(|d| d == harl_te::DType::F32);
    if !f32_only {
        return Err("GPU kernels are f32-only for now".into());
    }
    let program = lower(graph, schedule).map_err(|e| e.to_string())?;
    let module = crate::cuda::emit(&program).map_err(|e| e.to_string())?;
    let cc = tuned_for.map_or(DEFAULT_PTX_CC, |(major, minor)| major * 10 + minor);
    let ptx = compile_ptx(&module.source, cc)?;
    let launches: Vec<String> = module
        .launches
        .iter()
        .map(|l| format!("({:?}, {}, {})", l.name, l.grid, l.block))
        .collect();
    let temps: Vec<usize> = module
        .buffers
        .iter()
        .take(module.buffers.len().saturating_sub(1))
        .map(|&s| program.graph.stages[s].size())
        .collect();
    Ok(format!(
        "::harl::gpu::GpuProgram {{ ptx: {ptx:?}, tuned_for: {tuned_for:?}, launches: &[{}], temps: &{temps:?} }}",
        launches.join(", ")
    ))
}

#[cfg(feature = "cuda")]
fn compile_ptx(source: &str, cc: u32) -> Result<String, String> {
    crate::nvrtc::compile_ptx(source, cc).map_err(|e| match e {
        crate::nvrtc::NvrtcError::NoNvrtc => "no NVRTC on the build host (install the CUDA toolkit, or `pip install nvidia-cuda-nvrtc-cu12` and put its lib/ on LD_LIBRARY_PATH)".to_string(),
        e => e.to_string(),
    })
}

#[cfg(not(feature = "cuda"))]
fn compile_ptx(_: &str, _: u32) -> Result<String, String> {
    Err("harl-build was built without its `cuda` feature (NVRTC), so no PTX was made".into())
}
