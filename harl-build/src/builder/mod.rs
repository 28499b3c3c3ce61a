//! The `build.rs` entry point: find kernels, pick schedules, write generated Rust to `OUT_DIR`.
//!
//! ```no_run
//! // build.rs: fn main() { ... }
//! harl_build::Builder::new().scan_crate().compile();
//! ```
//! Kernels declared with `#[harl::kernel]` are found by scanning the crate's sources; ops can
//! also be registered directly with [`Builder::kernel`] and included with
//! `harl::include_kernels!()`.

mod env;
pub(crate) use env::cargo_home;
mod gpu;
#[cfg(feature = "onnx")]
mod model;
mod select;
mod tune;

use crate::directive::{escape, Directives};
use crate::manifest::MANIFEST_FILE;
use crate::scan;
use env::BuildEnv;
use harl_te::Graph;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Where an imported model's weights live when the user's binary runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ModelWeights {
    /// In the binary (`include_bytes!`): one file to ship, but a large model makes a large
    /// binary and a slower build (BERT-base's 340 MB add 26 s).
    #[default]
    Embedded,
    /// In a file the build writes, `$OUT_DIR/harl/{name}.weights` (the module's `WEIGHTS_PATH`),
    /// read at run time by `Model::load(path)` or handed over by `Model::from_weights(bytes)`;
    /// `Model::new()` reads the build's own copy.
    File,
}

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
    /// A model registered with `Builder::onnx` could not be imported or emitted.
    #[error("model `{name}`: {why}")]
    Model {
        /// Its name.
        name: String,
        /// What is wrong (the import error names the op, node and opset).
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
        /// The record says the default won its tune, so this harl's default schedule is
        /// used ([`crate::cache::Record::default_won`]).
        default_won: bool,
    },
    /// A cache record from a CPU of the same ISA class.
    CacheCompatible {
        /// Measured latency of the record.
        latency_s: f64,
        /// As for [`ScheduleSource::CacheExact`].
        default_won: bool,
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
            ScheduleSource::CacheExact {
                latency_s,
                default_won,
            } => {
                write!(f, "tuning cache, exact target (recorded {latency_s:.3e} s")?;
                default_won_note(f, *default_won)
            }
            ScheduleSource::CacheCompatible {
                latency_s,
                default_won,
            } => {
                write!(
                    f,
                    "tuning cache, same ISA class (recorded {latency_s:.3e} s"
                )?;
                default_won_note(f, *default_won)
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

/// Closes a cache source's parenthesis, saying when the record sent the build to its default.
fn default_won_note(f: &mut std::fmt::Formatter<'_>, default_won: bool) -> std::fmt::Result {
    if default_won {
        write!(
            f,
            "; the default won that tune, so this harl's default schedule)"
        )
    } else {
        write!(f, ")")
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
    /// Runs per use of the crate (an imported model's calls of the task; 1 otherwise): the
    /// task scheduler's weight when a tune shares one budget over the kernels.
    weight: f64,
}

/// Configures and runs harl's build step.
#[derive(Default)]
pub struct Builder {
    scan: Vec<PathBuf>,
    kernels: Vec<Registered>,
    /// ONNX models: (module name, file, where its weights live).
    #[cfg(feature = "onnx")]
    models: Vec<(String, PathBuf, ModelWeights)>,
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
            weight: 1.0,
        });
        self
    }

    /// Registers the ONNX model at `path` as module `name` of the file
    /// `harl::include_kernels!()` includes: `name::Model::new()?` prepares it,
    /// `model.run(&input, &mut output)?` runs it. Each of its tasks is a kernel `name_t{i}`,
    /// scheduled like any other (from the tuning cache, or tuned by `cargo harl tune`).
    /// The weights are embedded in the binary; [`Builder::onnx_with`] can keep them in a file.
    #[cfg(feature = "onnx")]
    pub fn onnx(self, name: &str, path: impl AsRef<Path>) -> Self {
        self.onnx_with(name, path, ModelWeights::Embedded)
    }

    /// [`Builder::onnx`], with the model's weights where `weights` says.
    #[cfg(feature = "onnx")]
    pub fn onnx_with(mut self, name: &str, path: impl AsRef<Path>, weights: ModelWeights) -> Self {
        self.models
            .push((name.to_string(), path.as_ref().to_path_buf(), weights));
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
            "HARL_COST_MODEL",
            "HARL_TUNE_SECONDS",
            "HARL_TOTAL_TRIALS",
            "HARL_TOTAL_SECONDS",
            "HARL_TASK_SCHEDULER",
            "HARL_GPU_TRIALS",
            "HARL_TUNER",
            "HARL_ISA",
            "HARL_TUNE_COLD",
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
        let models = self.import_models(&gen_dir, &out)?;
        let registered: Vec<&Registered> = self
            .kernels
            .iter()
            .chain(models.iter().flat_map(|m| m.kernels.iter()))
            .collect();
        let kernels: Vec<(&str, &Graph)> = found
            .iter()
            .map(|d| (d.name.as_str(), &d.graph))
            .chain(registered.iter().map(|k| (k.name.as_str(), &k.graph)))
            .collect();
        let weights: Vec<f64> = found
            .iter()
            .map(|_| 1.0)
            .chain(registered.iter().map(|k| k.weight))
            .collect();
        let manifest_path = gen_dir.join(MANIFEST_FILE);
        if let Err(e) = self
            .manifest(&kernels, &weights, &env, &gen_dir)
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
        for k in &registered {
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
        for m in &models {
            all.push_str(&m.module);
        }
        write_if_changed(&gen_dir.join("kernels.rs"), &all)?;
        Ok(report)
    }

    /// Imports every registered ONNX model: its tasks as kernels, its module, its weights
    /// file (written to `gen_dir`).
    #[cfg(feature = "onnx")]
    fn import_models(&self, gen_dir: &Path, out: &Directives) -> Result<Vec<Model>, BuildError> {
        let mut models = Vec::new();
        for (name, path, storage) in &self.models {
            let err = |why: String| BuildError::Model {
                name: name.clone(),
                why,
            };
            if !is_ident(name) {
                return Err(err("the name must be a Rust identifier".into()));
            }
            out.rerun_if_changed(path);
            let net = harl_te::onnx::import(path).map_err(|e| err(e.to_string()))?;
            let weights = model::weights_file(&net);
            let file_name = format!("{name}.weights");
            let weights_path = gen_dir.join(&file_name);
            if std::fs::read(&weights_path).ok().as_deref() != Some(weights.bytes.as_slice()) {
                std::fs::write(&weights_path, &weights.bytes).map_err(|source| BuildError::Io {
                    path: weights_path.clone(),
                    source,
                })?;
            }
            let module =
                model::emit_model(name, &net, &weights, &file_name, *storage).map_err(err)?;
            let kernels = net
                .tasks
                .iter()
                .enumerate()
                .map(|(t, task)| Registered {
                    name: model::task_name(name, t),
                    graph: task.graph.clone(),
                    weight: task.weight as f64,
                })
                .collect();
            models.push(Model { kernels, module });
        }
        Ok(models)
    }

    #[cfg(not(feature = "onnx"))]
    fn import_models(&self, _: &Path, _: &Directives) -> Result<Vec<Model>, BuildError> {
        Ok(Vec::new())
    }
}

/// An imported model: its tasks as kernels and its module's source.
struct Model {
    kernels: Vec<Registered>,
    module: String,
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
