//! Finding a crate's kernels exactly as its build script does: the tool builds the crate (its
//! build script writes `OUT_DIR/harl/manifest.json`, see `harl_build::manifest`) and reads the
//! manifests of the workspace's own packages from cargo's JSON messages.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use harl_build::manifest::{Manifest, ManifestError, MANIFEST_FILE};
use serde_json::Value;

/// Why a crate's kernels could not be found.
#[derive(Debug, thiserror::Error)]
pub enum CrateError {
    /// cargo could not be run or failed.
    #[error("{0}")]
    Cargo(String),
    /// A manifest is unreadable.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// No package of the workspace declares harl kernels.
    #[error("no package here writes a harl manifest: does its build.rs call harl_build::Builder (harl-build 0.1 or newer)?")]
    NoKernels,
}

/// The cargo to run: `CARGO` (set when cargo runs this tool as `cargo harl`), else `cargo`.
fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// The workspace members' package ids, from `cargo metadata`.
fn members(manifest_path: Option<&Path>) -> Result<HashSet<String>, CrateError> {
    let mut cmd = cargo();
    cmd.args(["metadata", "--format-version", "1", "--no-deps"]);
    if let Some(p) = manifest_path {
        cmd.arg("--manifest-path").arg(p);
    }
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| CrateError::Cargo(format!("cannot run cargo: {e}")))?;
    if !out.status.success() {
        return Err(CrateError::Cargo(format!(
            "cargo metadata failed ({})",
            out.status
        )));
    }
    let meta: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| CrateError::Cargo(format!("cargo metadata: {e}")))?;
    Ok(meta["workspace_members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(String::from))
        .collect())
}

/// Builds the crate (build scripts only tune when the tool says so: `HARL_TUNE=cache`) and
/// returns the manifests its own packages' builds wrote, in build order.
pub fn manifests(
    manifest_path: Option<&Path>,
    release: bool,
) -> Result<Vec<(PathBuf, Manifest)>, CrateError> {
    let members = members(manifest_path)?;
    let mut cmd = cargo();
    cmd.args(["build", "--message-format=json-render-diagnostics"]);
    if release {
        cmd.arg("--release");
    }
    if let Some(p) = manifest_path {
        cmd.arg("--manifest-path").arg(p);
    }
    let out = cmd
        .env("HARL_TUNE", "cache")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| CrateError::Cargo(format!("cannot run cargo: {e}")))?;
    if !out.status.success() {
        return Err(CrateError::Cargo(format!(
            "cargo build failed ({}); fix the build first",
            out.status
        )));
    }
    let mut found = Vec::new();
    for line in out.stdout.split(|&b| b == b'\n') {
        let Ok(msg) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        if msg["reason"] != "build-script-executed" {
            continue;
        }
        let own = msg["package_id"]
            .as_str()
            .is_some_and(|id| members.contains(id));
        let Some(out_dir) = msg["out_dir"].as_str().filter(|_| own) else {
            continue;
        };
        let path = Path::new(out_dir).join("harl").join(MANIFEST_FILE);
        if path.is_file() && found.iter().all(|(p, _)| p != &path) {
            let manifest = Manifest::read(&path)?;
            found.push((path, manifest));
        }
    }
    if found.is_empty() {
        return Err(CrateError::NoKernels);
    }
    Ok(found)
}

/// Where a command finds the crate's kernels: a build's manifest, or the crate, built.
#[derive(clap::Args, Debug)]
pub struct KernelsArgs {
    /// The crate's Cargo.toml (default: the one cargo finds from the current directory).
    #[arg(long, value_name = "PATH")]
    pub manifest_path: Option<PathBuf>,
    /// The kernels of this build manifest (`OUT_DIR/harl/manifest.json`) instead of building
    /// the crate; build scripts pass it to `tune`.
    #[arg(long, value_name = "FILE", conflicts_with = "manifest_path")]
    pub manifest: Option<PathBuf>,
    /// Build the crate in release mode to find its kernels (the same kernels; the release
    /// build's tuning logs).
    #[arg(long)]
    pub release: bool,
}

impl KernelsArgs {
    /// The manifests: the one named, or those the crate's build writes.
    pub fn load(&self) -> Result<Vec<(PathBuf, Manifest)>, CrateError> {
        match &self.manifest {
            Some(path) => Ok(vec![(path.clone(), Manifest::read(path)?)]),
            None => manifests(self.manifest_path.as_deref(), self.release),
        }
    }
}
