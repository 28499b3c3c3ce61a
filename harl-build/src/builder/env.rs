//! What the environment says about a build: the mode, the cache, the target, whose crate it is.

use super::{Builder, TuneMode};
use crate::target::TargetFingerprint;
use std::path::{Path, PathBuf};

/// What the environment says about this build.
pub(super) struct BuildEnv {
    pub(super) mode: TuneMode,
    pub(super) cache_dir: PathBuf,
    /// Records tuned by this crate's earlier builds that the cache directory refused.
    pub(super) local_cache: PathBuf,
    pub(super) target: TargetFingerprint,
    /// Threads the default schedules plan parallel work for.
    pub(super) threads: usize,
}

impl BuildEnv {
    pub(super) fn read(b: &Builder, gen_dir: &Path) -> BuildEnv {
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
                // `HARL_ISA` lowers what the runtime dispatches to; the build tunes and
                // records the variant it names, as the binary will run it.
                let fp = match std::env::var("HARL_ISA") {
                    Ok(isa) => TargetFingerprint::host().capped_at(&isa),
                    Err(_) => TargetFingerprint::host(),
                };
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

/// Cargo's home: `CARGO_HOME`, else `~/.cargo`.
pub(crate) fn cargo_home() -> Option<PathBuf> {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
}

/// Whether this build belongs to a crate the user does not own: one unpacked from a registry
/// or checked out by cargo (under `CARGO_HOME`), or vendored (`cargo vendor` writes
/// `.cargo-checksum.json`); or whether its cache directory lies under `CARGO_HOME`.
fn is_third_party(cache_dir: &Path) -> bool {
    let cargo_home = cargo_home();
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
