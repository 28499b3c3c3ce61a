//! Records timed again: every record a crate's build could pick for this CPU, timed beside the
//! schedule the build would use without it (this harl's default) in one worker batch a round,
//! in a rotating order, medians over the rounds. A record that no longer beats the default,
//! because it was made by an older harl whose defaults were weaker or on another CPU of the
//! same ISA class, is found here and can be dropped (`cargo harl cache retime --drop`).
//!
//! A tune already times its finalists beside the default before it records one
//! ([`crate::job`]); this is the same comparison made later, on the machine that ships.

use crate::measure::Measure;
use crate::tuner::{time_round, Runs};
use harl_build::cache::{best_first, Record, TuningCache};
use harl_build::default_schedule::{default_schedule, CpuTarget};
use harl_build::lower::lower;
use harl_build::manifest::Manifest;
use harl_build::schedule::Schedule;
use harl_te::Graph;

/// At most this many records of one workload are timed, best first as a build looks them up
/// (exact target, then lowest recorded latency): a file of many copies costs no more.
pub const MAX_RECORDS_PER_WORKLOAD: usize = 4;

/// One workload's records to time: the first kernel of the build with that workload.
#[derive(Clone, Debug)]
pub struct Retimed {
    /// The kernel's name.
    pub kernel: String,
    /// Its graph.
    pub graph: Graph,
    /// Its usable records for this CPU, best first.
    pub records: Vec<Record>,
}

/// What the new timing says of one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Faster than the default: by more than the margin in the medians, and in every round.
    Faster,
    /// Neither faster nor slower.
    Even,
    /// Slower than the default: by more than the margin in the medians, and in every round
    /// (so that noise rarely condemns an even record: with 5 rounds, 1 in 32 at worst). The
    /// build is better off without it.
    Slower,
    /// Every timed run of the record failed (it computed a wrong result, crashed or hung).
    Failed,
    /// The default could not be timed, so nothing is said of the record.
    Unjudged,
}

/// One record timed beside the default.
#[derive(Clone, Debug)]
pub struct RecordTiming {
    /// The kernel (the first of the build with this workload).
    pub kernel: String,
    /// The record.
    pub record: Record,
    /// Whether the record was made on exactly this CPU (else on another of its ISA class).
    pub exact: bool,
    /// Median latency of the default schedule in seconds, if it could be timed.
    pub default_s: Option<f64>,
    /// Median latency of the record's schedule in seconds, if it could be timed.
    pub record_s: Option<f64>,
    /// Rounds in which the record ran faster than the default (timed in the same batch).
    pub rounds_won: usize,
    /// Rounds in which both ran.
    pub rounds_paired: usize,
    /// Why the record's runs failed, when they all did.
    pub error: Option<String>,
}

impl RecordTiming {
    /// The default's latency over the record's: above 1 the record is faster.
    pub fn speedup(&self) -> Option<f64> {
        Some(self.default_s? / self.record_s?)
    }

    /// The verdict with a tolerance of `margin` (0.05: 5%) either way.
    pub fn verdict(&self, margin: f64) -> Verdict {
        let (won, paired) = (self.rounds_won, self.rounds_paired);
        match (self.default_s, self.record_s) {
            (None, _) => Verdict::Unjudged,
            (Some(_), None) => Verdict::Failed,
            (Some(d), Some(r)) if r > d * (1.0 + margin) && won == 0 => Verdict::Slower,
            (Some(d), Some(r)) if r * (1.0 + margin) < d && won == paired => Verdict::Faster,
            _ => Verdict::Even,
        }
    }
}

/// The records of `manifest`'s cache directory a build on this CPU could pick, per workload of
/// the build (kernels of one workload share records): compatible with the manifest's target
/// and replayable on the kernel's graph. Warnings name the lines of the file that are not
/// usable records.
pub fn candidates(manifest: &Manifest) -> (Vec<Retimed>, Vec<String>) {
    let target = &manifest.target;
    let (records, warnings) = TuningCache::new(&manifest.cache_dir).records(&target.isa_class);
    let mut out: Vec<Retimed> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for kernel in &manifest.kernels {
        if !seen.insert(kernel.workload_key.as_str()) {
            continue;
        }
        let mut mine: Vec<&Record> = records
            .iter()
            .filter(|r| r.workload_key == kernel.workload_key && r.target.is_compatible(target))
            .collect();
        mine.sort_by(|a, b| best_first(target, a, b));
        let mut kept: Vec<Record> = Vec::new();
        for r in mine {
            if kept.len() == MAX_RECORDS_PER_WORKLOAD {
                break;
            }
            let duplicate = kept.iter().any(|k| k.schedule == r.schedule);
            if duplicate || lower(&kernel.graph, &r.schedule).is_err() {
                continue;
            }
            // A build stops at a record whose tune the default won and uses its own default:
            // nothing from there on is ever picked, and the default needs no judging.
            if r.default_won {
                break;
            }
            kept.push(r.clone());
        }
        if !kept.is_empty() {
            out.push(Retimed {
                kernel: kernel.name.clone(),
                graph: kernel.graph.clone(),
                records: kept,
            });
        }
    }
    (out, warnings)
}

/// Times each record of `work` beside the default schedule for `cpu`, `rounds` rounds; a
/// round times every workload once, one batch each (its default and its records, the order
/// rotating from round to round), so that a slow spell of a shared machine falls on one round
/// of many workloads rather than on every round of one. Returns each record's timing, in
/// `work`'s order.
pub fn retime(
    manifest: &Manifest,
    work: &[Retimed],
    cpu: &CpuTarget,
    measurer: &mut dyn Measure,
    rounds: usize,
) -> Vec<RecordTiming> {
    measurer.set_best(None);
    let schedules: Vec<Vec<Schedule>> = work
        .iter()
        .map(|w| {
            std::iter::once(default_schedule(&w.graph, cpu))
                .chain(w.records.iter().map(|r| r.schedule.clone()))
                .collect()
        })
        .collect();
    let mut runs: Vec<Vec<Runs>> = schedules
        .iter()
        .map(|s| s.iter().map(|_| Runs::default()).collect())
        .collect();
    for round in 0..rounds.max(1) {
        for ((w, s), r) in work.iter().zip(&schedules).zip(&mut runs) {
            time_round(measurer, &w.graph, s, round, r);
        }
    }
    let mut out = Vec::new();
    for (w, runs) in work.iter().zip(&runs) {
        let default = &runs[0];
        for (record, timed) in w.records.iter().zip(&runs[1..]) {
            let paired: Vec<(f64, f64)> = default
                .latencies
                .iter()
                .zip(&timed.latencies)
                .filter_map(|(d, r)| Some(((*d)?, (*r)?)))
                .collect();
            let record_s = timed.median();
            out.push(RecordTiming {
                kernel: w.kernel.clone(),
                exact: record.target == manifest.target,
                record: record.clone(),
                default_s: default.median(),
                record_s,
                rounds_won: paired.iter().filter(|(d, r)| r < d).count(),
                rounds_paired: paired.len(),
                error: timed.error.clone().filter(|_| record_s.is_none()),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use harl_build::cache::RECORD_VERSION;
    use harl_build::manifest::{ManifestKernel, MANIFEST_VERSION};
    use harl_build::schedule::Step;
    use harl_build::target::TargetFingerprint;
    use harl_te::ops::workloads;
    use std::path::Path;

    /// Times a schedule by its last step: the default (its own steps) at 1 ms, a schedule
    /// ending in `Parallel` at 0.5 ms, one ending in `Unroll` at 2 ms; any other fails.
    struct Fake {
        default: Schedule,
        batches: usize,
    }

    impl Measure for Fake {
        fn measure(&mut self, _: &Graph, schedules: &[Schedule]) -> Vec<Result<f64, String>> {
            self.batches += 1;
            schedules
                .iter()
                .map(|s| {
                    if *s == self.default {
                        return Ok(1e-3);
                    }
                    match s.steps.last() {
                        Some(Step::Parallel { .. }) => Ok(0.5e-3),
                        Some(Step::Unroll { .. }) => Ok(2e-3),
                        _ => Err("wrong result at element 3".into()),
                    }
                })
                .collect()
        }
    }

    fn manifest(dir: &Path, graph: &Graph) -> Manifest {
        let target = TargetFingerprint::host();
        Manifest {
            version: MANIFEST_VERSION,
            package: "p".into(),
            manifest_dir: dir.into(),
            cache_dir: dir.join("cache"),
            local_cache: dir.join("local"),
            gen_dir: dir.join("out/harl"),
            harl_root: None,
            target,
            threads: 1,
            cuda: false,
            kernels: ["a", "a_again"]
                .iter()
                .map(|n| ManifestKernel {
                    name: (*n).into(),
                    workload_key: graph.workload_key(),
                    graph: graph.clone(),
                    weight: 1.0,
                })
                .collect(),
        }
    }

    fn record(graph: &Graph, target: TargetFingerprint, schedule: Schedule, s: f64) -> Record {
        Record {
            version: RECORD_VERSION,
            workload_key: graph.workload_key(),
            workload: "mm".into(),
            target,
            schedule,
            latency_s: s,
            trials: 64,
            harl_version: "0".into(),
            default_won: false,
        }
    }

    /// A build stops at a record whose tune the default won and uses its default: the records
    /// before it are timed, none after it.
    #[test]
    fn records_after_one_the_default_won_are_not_timed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let graph = workloads::matmul(32, 32, 32).expect("matmul");
        let m = manifest(dir.path(), &graph);
        let schedule = |step: Step| Schedule { steps: vec![step] };
        let parallel = schedule(Step::Parallel { stage: 0, at: 0 });
        let unroll = schedule(Step::Unroll { stage: 0, at: 1 });
        let reorder = schedule(Step::Reorder {
            stage: 0,
            order: vec![1, 0, 2],
        });
        let file = TuningCache::new(&m.cache_dir).path_for(&m.target.isa_class);
        std::fs::create_dir_all(&m.cache_dir).expect("mkdir");
        let records = [
            record(&graph, m.target.clone(), unroll, 3e-3),
            record(&graph, m.target.clone(), reorder, 2e-3).with_default_won(true),
            record(&graph, m.target.clone(), parallel.clone(), 1e-3),
        ];
        harl_build::cache::write_records(&file, &records).expect("write");
        let (work, _) = candidates(&m);
        let timed: Vec<&Schedule> = work[0].records.iter().map(|r| &r.schedule).collect();
        assert_eq!(timed, [&parallel]);
        // With the default's record the fastest, nothing is left to time.
        harl_build::cache::write_records(&file, &records[..2]).expect("write");
        assert!(candidates(&m).0.is_empty());
    }

    #[test]
    fn each_usable_record_is_timed_beside_the_default_and_judged() {
        let dir = tempfile::tempdir().expect("tempdir");
        let graph = workloads::matmul(32, 32, 32).expect("matmul");
        let m = manifest(dir.path(), &graph);
        let cpu = harl_build::codegen::Variant::host().cpu_target(&m.target.arch, 1);
        let default = default_schedule(&graph, &cpu);
        let with_last = |step: Step| {
            let mut s = Schedule::default();
            s.steps.push(step);
            s
        };
        let parallel = with_last(Step::Parallel { stage: 0, at: 0 });
        let unroll = with_last(Step::Unroll { stage: 0, at: 1 });
        let reorder_only = with_last(Step::Reorder {
            stage: 0,
            order: vec![1, 0, 2],
        });
        let mut other_cpu = m.target.clone();
        other_cpu.cpu_model = "another CPU of the class".into();
        let mut other_class = m.target.clone();
        other_class.isa_class = "x86_64-other".into();
        let cache = TuningCache::new(&m.cache_dir);
        let file = cache.path_for(&m.target.isa_class);
        let records = [
            record(&graph, m.target.clone(), parallel.clone(), 2e-3),
            record(&graph, other_cpu, unroll.clone(), 1e-4),
            // The same schedule again: timed once.
            record(&graph, m.target.clone(), parallel.clone(), 3e-3),
            record(&graph, m.target.clone(), reorder_only.clone(), 4e-3),
        ];
        std::fs::create_dir_all(&m.cache_dir).expect("mkdir");
        harl_build::cache::write_records(&file, &records).expect("write");
        let (work, warnings) = candidates(&m);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(work.len(), 1, "one workload, though two kernels have it");
        assert_eq!(work[0].kernel, "a");
        // Exact records first (by latency), then the other CPU's.
        let order: Vec<&Schedule> = work[0].records.iter().map(|r| &r.schedule).collect();
        assert_eq!(order, [&parallel, &reorder_only, &unroll]);
        let mut fake = Fake {
            default: default.clone(),
            batches: 0,
        };
        let timings = retime(&m, &work, &cpu, &mut fake, 3);
        assert_eq!(fake.batches, 3);
        let verdicts: Vec<(Verdict, bool)> =
            timings.iter().map(|t| (t.verdict(0.05), t.exact)).collect();
        assert_eq!(
            verdicts,
            [
                (Verdict::Faster, true),
                (Verdict::Failed, true),
                (Verdict::Slower, false)
            ]
        );
        assert_eq!(timings[0].speedup(), Some(2.0));
        assert_eq!(
            timings[1].error.as_deref(),
            Some("wrong result at element 3")
        );
        assert_eq!((timings[0].rounds_won, timings[0].rounds_paired), (3, 3));
        assert_eq!((timings[2].rounds_won, timings[2].rounds_paired), (0, 3));
        let even = RecordTiming {
            record_s: Some(1.04e-3),
            ..timings[0].clone()
        };
        assert_eq!(even.verdict(0.05), Verdict::Even);
        // Slower in the medians but faster in one round of three: not condemned.
        let mixed = RecordTiming {
            rounds_won: 1,
            ..timings[2].clone()
        };
        assert_eq!(mixed.verdict(0.05), Verdict::Even);
        let unjudged = RecordTiming {
            default_s: None,
            ..timings[0].clone()
        };
        assert_eq!(unjudged.verdict(0.05), Verdict::Unjudged);
    }
}
