//! Choosing each ISA variant's schedule (a cache record, else the default) and emitting the
//! kernel module: the build's main path.

use super::gpu::{gpu_item, gpu_records};
use super::{BuildEnv, Builder, ScheduleSource, TuneMode};
use crate::cache::{LookupSource, Record, TuningCache};
use crate::codegen::{emit_module, KernelMeta, Variant, VariantProgram};
use crate::default_schedule::default_schedule;
use crate::limits::MAX_SOURCE_BYTES;
use crate::loop_ir::Program;
use crate::lower::lower;
use crate::manifest::TuneOutcome;
use crate::schedule::Schedule;
use crate::target::TargetFingerprint;
use harl_te::Graph;
use std::collections::HashMap;

impl Builder {
    /// Picks each ISA variant's schedule (cache record or default) and emits the module; never
    /// fails: a bad record is a warning and the default schedule. Returns the code, the source
    /// of the variant this build host runs, and the workload key.
    pub(super) fn generate(
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
                Some(Picked {
                    program: Some(program),
                    source,
                }) => (Ok(program), source),
                Some(Picked {
                    program: None,
                    source,
                }) => (lower(graph, &default_schedule(graph, &cpu)), source),
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

    /// The best valid cache record for one ISA class, if tuning records are in use.
    pub(super) fn pick_schedule(
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
        let (latency_s, default_won) = (r.latency_s, r.default_won);
        let source = match lookup.source {
            LookupSource::Exact => ScheduleSource::CacheExact {
                latency_s,
                default_won,
            },
            _ => ScheduleSource::CacheCompatible {
                latency_s,
                default_won,
            },
        };
        let program = program?;
        Some(Picked {
            source,
            program: (!default_won).then_some(program),
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

/// A schedule taken from the cache, with its program (lowered once, when it was validated);
/// no program where the record sends the build to its own default schedule.
pub(super) struct Picked {
    pub(super) source: ScheduleSource,
    pub(super) program: Option<Program>,
}
