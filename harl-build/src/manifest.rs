//! The kernels of one build, as the build script found them: written to
//! `OUT_DIR/harl/manifest.json` by every build, read by `cargo harl tune`, which so tunes exactly
//! the kernels (scanned and registered with `Builder::kernel`) that the build generates.
//!
//! The file is data from a build directory, so the reader treats it like a cache file: a size
//! cap, a version, every graph validated, every name checked, before anything uses it.

use crate::target::TargetFingerprint;
use harl_te::Graph;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The manifest's file name inside `OUT_DIR/harl/`.
pub const MANIFEST_FILE: &str = "manifest.json";

/// The format version this harl writes and reads.
pub const MANIFEST_VERSION: u32 = 1;

/// A manifest larger than this is refused (a crate's kernels are far smaller).
pub const MAX_MANIFEST_BYTES: u64 = 64 << 20;

/// The largest weight a kernel may have (a network runs no task more often than this).
pub const MAX_WEIGHT: f64 = 1e6;

/// Why a manifest could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// Reading the file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not a manifest this harl understands.
    #[error("{}: {why}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

/// One kernel of the build.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ManifestKernel {
    /// The kernel's name (its `fn` or `Builder::kernel` name).
    pub name: String,
    /// Its workload key (what cache records are looked up by).
    pub workload_key: String,
    /// Its tensor expression.
    pub graph: Graph,
    /// How many times one use of the crate runs it (an imported model's calls of the task; 1
    /// for a declared kernel): its weight when a tune shares one budget over the kernels.
    #[serde(default = "one")]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

/// Everything a tuner needs to tune a build's kernels as that build would use them.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_VERSION`].
    pub version: u32,
    /// The package whose build wrote it (`CARGO_PKG_NAME`).
    pub package: String,
    /// The crate's directory (`CARGO_MANIFEST_DIR`).
    pub manifest_dir: PathBuf,
    /// Where the build reads records and a tune writes them.
    pub cache_dir: PathBuf,
    /// Where a tune keeps records the cache directory refuses (a read-only cache), inside
    /// `OUT_DIR`; the build reads them too.
    pub local_cache: PathBuf,
    /// The build's `OUT_DIR/harl` (generated code, this manifest, tuning logs).
    pub gen_dir: PathBuf,
    /// The `harl` crate's source (`DEP_HARL_ROOT`), which measurement workers link; `None` when
    /// the crate does not depend on `harl` directly.
    pub harl_root: Option<PathBuf>,
    /// The CPU the build runs on and records are filed under.
    pub target: TargetFingerprint,
    /// Threads the kernels plan parallel work for.
    pub threads: usize,
    /// Whether the build also generates GPU code.
    pub cuda: bool,
    /// Every kernel, in the order the build generates them.
    pub kernels: Vec<ManifestKernel>,
}

impl Manifest {
    /// Writes the manifest atomically (a temporary file renamed over it).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let text = serde_json::to_string(self).map_err(std::io::Error::other)?;
        let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, path)
    }

    /// Reads and validates a manifest.
    pub fn read(path: &Path) -> Result<Manifest, ManifestError> {
        let io = |source| ManifestError::Io {
            path: path.to_path_buf(),
            source,
        };
        let invalid = |why: String| ManifestError::Invalid {
            path: path.to_path_buf(),
            why,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        if !meta.is_file() {
            return Err(invalid("not a regular file".into()));
        }
        if meta.len() > MAX_MANIFEST_BYTES {
            return Err(invalid(format!(
                "{} bytes, over the limit of {MAX_MANIFEST_BYTES}",
                meta.len()
            )));
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        let manifest: Manifest =
            serde_json::from_str(&text).map_err(|e| invalid(format!("not a manifest: {e}")))?;
        if manifest.version != MANIFEST_VERSION {
            return Err(invalid(format!(
                "manifest version {} (this harl reads {MANIFEST_VERSION}); rebuild the crate",
                manifest.version
            )));
        }
        for k in &manifest.kernels {
            if k.name.is_empty() || k.name.len() > 1024 || k.name.chars().any(char::is_control) {
                return Err(invalid(
                    "a kernel name is empty, too long or has control characters".into(),
                ));
            }
            k.graph
                .validate()
                .map_err(|e| invalid(format!("kernel `{}`: {e}", k.name)))?;
            if !(k.weight.is_finite() && k.weight > 0.0 && k.weight <= MAX_WEIGHT) {
                return Err(invalid(format!(
                    "kernel `{}`: weight {} is not in (0, {MAX_WEIGHT}]",
                    k.name, k.weight
                )));
            }
            if k.graph.workload_key() != k.workload_key {
                return Err(invalid(format!(
                    "kernel `{}`: its workload key does not match its graph",
                    k.name
                )));
            }
        }
        Ok(manifest)
    }
}

/// What the tuner did with one kernel, written by `cargo harl tune --results FILE` for the
/// build script that called it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TuneOutcome {
    /// The kernel's name.
    pub name: String,
    /// Its workload key.
    pub workload_key: String,
    /// Trials measured.
    pub trials: usize,
    /// Seconds the kernel's tune took.
    pub wall_s: f64,
    /// The winner's latency (never slower than the default schedule's), if any trial ran.
    pub latency_s: Option<f64>,
    /// The default schedule's latency, measured in the same run.
    pub default_latency_s: Option<f64>,
    /// The file the record went to.
    pub recorded_in: Option<PathBuf>,
    /// What went wrong or what to know (the record could not be written, every trial failed).
    pub note: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use harl_te::{BinaryOp, DType, Expr, GraphBuilder};

    /// A graph whose constants need every bit of their f64 (a max pool's -f32::MAX padding,
    /// a third) reads back with the same workload key.
    #[test]
    fn a_manifest_reads_back_with_exact_constants() {
        let mut b = GraphBuilder::new();
        let x = b.input("x", &[4], DType::F32);
        harl_te::ops::relu(&mut b, x).expect("relu");
        let mut graph = b.finish().expect("graph");
        for c in [f64::from(f32::MIN), 1.0 / 3.0, 2.0f64.powi(-1074), -0.0] {
            let body = graph.stages[0].body.clone();
            graph.stages[0].body = body.binary(BinaryOp::Max, Expr::lit(c, DType::F32));
        }
        graph.validate().expect("valid");
        let dir = tempfile::tempdir().expect("tempdir");
        let manifest = Manifest {
            version: MANIFEST_VERSION,
            package: "p".into(),
            manifest_dir: dir.path().into(),
            cache_dir: dir.path().join("c"),
            local_cache: dir.path().join("l"),
            gen_dir: dir.path().into(),
            harl_root: None,
            target: TargetFingerprint::host(),
            threads: 1,
            cuda: false,
            kernels: vec![ManifestKernel {
                name: "k".into(),
                workload_key: graph.workload_key(),
                graph,
                weight: 2.0,
            }],
        };
        let path = dir.path().join(MANIFEST_FILE);
        manifest.write(&path).expect("write");
        let back = Manifest::read(&path).expect("read back");
        assert_eq!(back.kernels[0].graph, manifest.kernels[0].graph);
        assert_eq!(back.kernels[0].weight, 2.0);
    }
}
