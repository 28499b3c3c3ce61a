//! `HARL_TUNE=on`: the build's manifest and the call to the installed tuner.

use super::select::Picked;
use super::{BuildEnv, Builder, ScheduleSource};
use crate::manifest::{Manifest, ManifestKernel, TuneOutcome, MANIFEST_VERSION};
use crate::tuner_tool::{find_tuner, run_tuner, TUNER_BIN};
use harl_te::Graph;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

impl Builder {
    /// The build's kernels as `cargo harl tune` reads them.
    pub(super) fn manifest(
        &self,
        kernels: &[(&str, &Graph)],
        weights: &[f64],
        env: &BuildEnv,
        gen_dir: &Path,
    ) -> Manifest {
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
                .zip(weights)
                .map(|((name, graph), &weight)| ManifestKernel {
                    name: name.to_string(),
                    workload_key: graph.workload_key(),
                    graph: (*graph).clone(),
                    weight,
                })
                .collect(),
        }
    }

    /// Whether some kernel lacks a usable record for exactly this CPU (GPU kernels are always
    /// handed to the tuner, which knows the device).
    pub(super) fn needs_tuning(&self, kernels: &[(&str, &Graph)], env: &BuildEnv) -> bool {
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
    pub(super) fn call_tuner(
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
}
