//! The tuning cache: versioned JSON-lines records of tuned schedules, one file per ISA class.
//!
//! A cache directory holds `<isa_class>.jsonl` files (e.g. `x86_64-avx2.jsonl`); each line is one
//! [`Record`]. Crates ship the directory so that their builds can replay tuned schedules without
//! tuning. Reading never fails on bad content: a corrupt, future-version or invalid line is
//! skipped with a warning, and the next-best record is used. Writing ([`TuningCache::append`])
//! holds an exclusive lock on a `<file>.lock` sidecar and replaces the file atomically, so
//! concurrent builds neither lose records nor expose half-written files.
//!
//! Here: the lookup (which record to use). `record`: the record and its line parser. `file`:
//! capped reads of regular files and locked, atomic appends. The limits that bound what a file
//! can cost are in [`crate::limits`].

use std::io;
use std::path::PathBuf;

use crate::limits::{MAX_LOOKUP_WARNINGS, MAX_VALIDATIONS};
use crate::target::TargetFingerprint;

mod file;
mod record;

use file::read_lines;
pub use file::{read_capped, read_file, write_records, NumberedLine};
pub use record::{parse_record, Record, RecordError, RECORD_VERSION};

/// How good a match [`TuningCache::lookup`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LookupSource {
    /// A record measured on exactly this target (same fingerprint in every field).
    Exact,
    /// A record measured on another machine of the same ISA class.
    CompatibleIsa,
    /// No usable record: the caller falls back to its default schedule.
    Default,
}

/// The result of [`TuningCache::lookup`].
#[derive(Clone, Debug, PartialEq)]
pub struct Lookup {
    /// The chosen record, if any usable one was found.
    pub record: Option<Record>,
    /// Where the record came from; [`LookupSource::Default`] exactly when `record` is `None`.
    pub source: LookupSource,
    /// One message per skipped line (file, line number and reason) or unreadable file.
    pub warnings: Vec<String>,
}

/// Errors writing to the cache. Reading never errors; see [`TuningCache::lookup`].
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A filesystem operation failed.
    #[error("tuning cache I/O error at {}: {source}", path.display())]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The record could not be serialized to JSON.
    #[error("could not serialize tuning record: {0}")]
    Serialize(#[from] serde_json::Error),
    /// The record would be rejected when read back (wrong version, bad latency, ...).
    #[error("invalid tuning record: {0}")]
    InvalidRecord(String),
}

/// The order in which a lookup for `target` prefers records: those measured on exactly
/// `target` first, then the lowest latency.
pub fn best_first(target: &TargetFingerprint, a: &Record, b: &Record) -> std::cmp::Ordering {
    (a.target != *target)
        .cmp(&(b.target != *target))
        .then(a.latency_s.total_cmp(&b.latency_s))
}

/// A tuning cache rooted at a directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TuningCache {
    /// The directory holding the `<isa_class>.jsonl` files.
    pub dir: PathBuf,
}

impl TuningCache {
    /// A cache rooted at `dir`. Nothing is touched until a lookup or append.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        TuningCache { dir: dir.into() }
    }

    /// The file holding records of the ISA class `isa_class`: `<dir>/<isa_class>.jsonl`.
    /// Characters other than ASCII letters, digits, `-` and `_` are replaced by `_` so that the
    /// class can never name a path outside the directory.
    pub fn path_for(&self, isa_class: &str) -> PathBuf {
        let mut name: String = isa_class
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if name.is_empty() {
            name.push('_');
        }
        name.push_str(".jsonl");
        self.dir.join(name)
    }

    /// Finds the best record for `workload_key` on `target`, in the file of `target.isa_class`.
    ///
    /// Records measured on exactly `target` come first, then records of any machine with the
    /// same ISA class; within a level the lowest `latency_s` wins (the earliest line on a tie).
    /// A line is skipped, with one warning naming the file, the line number and the reason, when
    /// it is not valid JSON, has an unknown `version`, does not parse as a [`Record`], has a
    /// latency that is not finite and positive, or belongs to another ISA class than the file.
    /// Lines of other workloads are skipped silently (corrupt lines that name no workload are
    /// always reported). The usable records are then tried best first with `validate` (one
    /// warning each that fails) until one passes, at most [`MAX_VALIDATIONS`] of them, so that
    /// a file of a million copies of a record costs one validation, not a million; and at most
    /// [`MAX_LOOKUP_WARNINGS`] warnings are kept, the rest counted in a last one. A missing
    /// file is no record and no warning; other I/O errors become warnings. This never fails.
    pub fn lookup(
        &self,
        workload_key: &str,
        target: &TargetFingerprint,
        validate: impl Fn(&Record) -> Result<(), String>,
    ) -> Lookup {
        let path = self.path_for(&target.isa_class);
        let mut warnings = Vec::new();
        let at = |line_no: usize, reason: &str| format!("{}:{line_no}: {reason}", path.display());
        let mut candidates: Vec<(usize, Record)> = Vec::new();
        for (line_no, line) in read_lines(&path, &mut warnings) {
            match line {
                Ok(record) if record.workload_key != workload_key => {}
                Ok(record) if !record.target.is_compatible(target) => {
                    warnings.push(at(line_no, &misfiled(&record, &target.isa_class)));
                }
                Ok(record) => candidates.push((line_no, record)),
                Err(RecordError { key, reason }) => {
                    if key.as_deref().is_none_or(|k| k == workload_key) {
                        warnings.push(at(line_no, &reason));
                    }
                }
            }
        }
        // Best first; the earliest line on a tie (the sort is stable).
        candidates.sort_by(|(_, a), (_, b)| best_first(target, a, b));
        let tried = candidates.len().min(MAX_VALIDATIONS);
        let mut chosen = None;
        for (line_no, record) in candidates.drain(..).take(tried) {
            match validate(&record) {
                Ok(()) => {
                    chosen = Some(record);
                    break;
                }
                Err(reason) => warnings.push(at(line_no, &format!("record rejected: {reason}"))),
            }
        }
        if chosen.is_none() && tried == MAX_VALIDATIONS && candidates.len() > tried {
            warnings.push(format!(
                "{}: {} more records of this workload not tried (at most {MAX_VALIDATIONS} are)",
                path.display(),
                candidates.len() - tried
            ));
        }
        if warnings.len() > MAX_LOOKUP_WARNINGS {
            let more = warnings.len() - (MAX_LOOKUP_WARNINGS - 1);
            warnings.truncate(MAX_LOOKUP_WARNINGS - 1);
            warnings.push(format!(
                "{}: {more} more warnings about this file",
                path.display()
            ));
        }
        let source = match &chosen {
            Some(r) if r.target == *target => LookupSource::Exact,
            Some(_) => LookupSource::CompatibleIsa,
            None => LookupSource::Default,
        };
        Lookup {
            record: chosen,
            source,
            warnings,
        }
    }

    /// Every valid record in the file of `isa_class`, in file order, with one warning per
    /// skipped line (for any workload) or unreadable file. A missing file gives neither.
    pub fn records(&self, isa_class: &str) -> (Vec<Record>, Vec<String>) {
        let path = self.path_for(isa_class);
        let mut warnings = Vec::new();
        let mut records = Vec::new();
        for (line_no, line) in read_lines(&path, &mut warnings) {
            let reason = match line {
                Ok(record) if record.target.isa_class == isa_class => {
                    records.push(record);
                    continue;
                }
                Ok(record) => misfiled(&record, isa_class),
                Err(RecordError { reason, .. }) => reason,
            };
            warnings.push(format!("{}:{line_no}: {reason}", path.display()));
        }
        (records, warnings)
    }
}

/// The warning for a record filed under the wrong ISA class.
fn misfiled(record: &Record, isa_class: &str) -> String {
    format!(
        "record is for ISA class {:?}, not {isa_class:?}",
        record.target.isa_class
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Schedule;
    use crate::schedule::Step;
    use std::fs;
    use std::path::PathBuf;

    fn target(cpu: &str) -> TargetFingerprint {
        TargetFingerprint {
            arch: "x86_64".into(),
            isa_class: "x86_64-avx2".into(),
            features: vec!["avx2".into(), "fma".into()],
            cpu_model: cpu.into(),
            cores: 8,
        }
    }

    fn schedule(factor: usize) -> Schedule {
        Schedule {
            steps: vec![Step::Split {
                stage: 0,
                at: 0,
                factors: vec![factor],
            }],
        }
    }

    fn record(key: &str, t: TargetFingerprint, latency_s: f64, factor: usize) -> Record {
        Record::new(key, "matmul 64x64x64", t, schedule(factor), latency_s, 100)
    }

    fn ok(_: &Record) -> Result<(), String> {
        Ok(())
    }

    fn write_lines(cache: &TuningCache, isa_class: &str, lines: &[String]) -> PathBuf {
        fs::create_dir_all(&cache.dir).unwrap();
        let path = cache.path_for(isa_class);
        let mut text = lines.join("\n");
        text.push('\n');
        fs::write(&path, text).unwrap();
        path
    }

    fn line(r: &Record) -> String {
        serde_json::to_string(r).unwrap()
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TuningCache::new(dir.path().join("nested/cache"));
        let r = record("k1", target("A"), 1e-3, 8);
        let path = cache.append(&r).unwrap();
        assert_eq!(path, dir.path().join("nested/cache/x86_64-avx2.jsonl"));
        assert!(path.exists());

        let found = cache.lookup("k1", &target("A"), ok);
        assert_eq!(found.source, LookupSource::Exact);
        assert_eq!(found.record.as_ref(), Some(&r));
        assert!(found.warnings.is_empty(), "{:?}", found.warnings);

        let other = cache.lookup("k2", &target("A"), ok);
        assert_eq!(other.source, LookupSource::Default);
        assert_eq!(other.record, None);
        assert!(other.warnings.is_empty());

        let (all, warnings) = cache.records("x86_64-avx2");
        assert_eq!(all, vec![r]);
        assert!(warnings.is_empty());
        assert_eq!(fs::read_to_string(&path).unwrap().lines().count(), 1);
    }

    #[test]
    fn exact_beats_faster_compatible() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TuningCache::new(dir.path());
        let exact = record("k", target("A"), 2e-3, 4);
        let compatible = record("k", target("B"), 1e-3, 8);
        cache.append(&compatible).unwrap();
        cache.append(&exact).unwrap();

        let found = cache.lookup("k", &target("A"), ok);
        assert_eq!(found.source, LookupSource::Exact);
        assert_eq!(found.record, Some(exact));

        let found = cache.lookup("k", &target("C"), ok);
        assert_eq!(found.source, LookupSource::CompatibleIsa);
        assert_eq!(found.record, Some(compatible));

        // A different core count is not exact.
        let mut fewer = target("A");
        fewer.cores = 2;
        assert_eq!(
            cache.lookup("k", &fewer, ok).source,
            LookupSource::CompatibleIsa
        );

        // Another ISA class reads another file.
        let baseline = TargetFingerprint::for_target_triple("x86_64-unknown-linux-gnu");
        let found = cache.lookup("k", &baseline, ok);
        assert_eq!(found.source, LookupSource::Default);
        assert!(found.warnings.is_empty());
    }

    #[test]
    fn lowest_latency_wins_within_level() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TuningCache::new(dir.path());
        for (latency, factor) in [(3e-3, 2), (1e-3, 4), (2e-3, 8)] {
            cache
                .append(&record("k", target("A"), latency, factor))
                .unwrap();
            cache
                .append(&record("k", target("B"), latency / 10.0, factor))
                .unwrap();
        }
        // A faster record of another workload does not interfere.
        cache
            .append(&record("other", target("A"), 1e-9, 16))
            .unwrap();

        let found = cache.lookup("k", &target("A"), ok);
        assert_eq!(found.source, LookupSource::Exact);
        let r = found.record.unwrap();
        assert_eq!(r.latency_s, 1e-3);
        assert_eq!(r.schedule, schedule(4));

        let found = cache.lookup("k", &target("Z"), ok);
        assert_eq!(found.source, LookupSource::CompatibleIsa);
        assert_eq!(found.record.unwrap().latency_s, 1e-4);
    }

    #[test]
    fn corrupt_line_warns_and_others_are_used() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TuningCache::new(dir.path());
        let good = record("k", target("A"), 1e-3, 4);
        let path = write_lines(
            &cache,
            "x86_64-avx2",
            &[
                "{not json".to_string(),
                line(&good),
                r#"{"version": 1, "workload_key": "k", "latency_s": 1e-9}"#.to_string(),
                r#"{"version": 1, "workload_key": "other", "latency_s": 1e-9}"#.to_string(),
            ],
        );
        let found = cache.lookup("k", &target("A"), ok);
        assert_eq!(found.source, LookupSource::Exact);
        assert_eq!(found.record, Some(good.clone()));
        assert_eq!(found.warnings.len(), 2, "{:?}", found.warnings);
        let file = path.display().to_string();
        assert!(found.warnings[0].starts_with(&format!("{file}:1: invalid JSON")));
        assert!(found.warnings[1].starts_with(&format!("{file}:3: invalid record")));

        // Appending keeps the corrupt lines and adds a parseable one.
        let better = record("k", target("A"), 5e-4, 8);
        cache.append(&better).unwrap();
        let found = cache.lookup("k", &target("A"), ok);
        assert_eq!(found.record, Some(better));
        assert_eq!(found.warnings.len(), 2);

        let (all, warnings) = cache.records("x86_64-avx2");
        assert_eq!(all.len(), 2);
        assert_eq!(warnings.len(), 3, "{warnings:?}");
    }

    #[test]
    fn truncated_last_line_is_repaired_by_append() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TuningCache::new(dir.path());
        fs::write(cache.path_for("x86_64-avx2"), "{\"version\": 1, \"wor").unwrap();
        let r = record("k", target("A"), 1e-3, 4);
        cache.append(&r).unwrap();
        let found = cache.lookup("k", &target("A"), ok);
        assert_eq!(found.record, Some(r));
        assert_eq!(found.warnings.len(), 1);
        assert!(found.warnings[0].contains(":1: invalid JSON"));
    }

    #[test]
    fn future_version_is_skipped_with_warning() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TuningCache::new(dir.path());
        let good = record("k", target("A"), 1e-3, 4);
        let mut future = serde_json::to_value(record("k", target("A"), 1e-6, 8)).unwrap();
        future["version"] = 99.into();
        let path = write_lines(
            &cache,
            "x86_64-avx2",
            &[
                future.to_string(),
                // A future shape: most fields gone, some new ones.
                r#"{"version": 99, "workload_key": "k", "plan": [1, 2, 3]}"#.to_string(),
                r#"{"version": 99, "something": "else"}"#.to_string(),
                r#"{"version": 99, "workload_key": "other"}"#.to_string(),
                line(&good),
            ],
        );
        let found = cache.lookup("k", &target("A"), ok);
        assert_eq!(found.record, Some(good));
        assert_eq!(found.source, LookupSource::Exact);
        let file = path.display().to_string();
        assert_eq!(
            found.warnings,
            vec![
                format!("{file}:1: unknown record version 99"),
                format!("{file}:2: unknown record version 99"),
                format!("{file}:3: unknown record version 99"),
            ]
        );

        // Only the future line: nothing usable.
        write_lines(&cache, "x86_64-avx2", &[future.to_string()]);
        let found = cache.lookup("k", &target("A"), ok);
        assert_eq!(found.source, LookupSource::Default);
        assert_eq!(found.warnings.len(), 1);
    }

    #[test]
    fn failing_validation_falls_back_to_next_best() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TuningCache::new(dir.path());
        let best_exact = record("k", target("A"), 1e-4, 64);
        let next_exact = record("k", target("A"), 2e-4, 4);
        let compatible = record("k", target("B"), 1e-5, 32);
        for r in [&best_exact, &next_exact, &compatible] {
            cache.append(r).unwrap();
        }
        let reject_big = |r: &Record| match r.schedule.steps.first() {
            Some(Step::Split { factors, .. }) if factors[0] > 16 => {
                Err(format!("factor {} too large", factors[0]))
            }
            _ => Ok(()),
        };
        let found = cache.lookup("k", &target("A"), reject_big);
        assert_eq!(found.source, LookupSource::Exact);
        assert_eq!(found.record, Some(next_exact));
        // The compatible record (line 3) is never tried: an exact one passed first.
        assert_eq!(found.warnings.len(), 1, "{:?}", found.warnings);
        assert!(found.warnings[0].ends_with(":1: record rejected: factor 64 too large"));

        // When every exact record fails, fall back to a compatible one.
        let only_b = |r: &Record| {
            if r.target.cpu_model == "B" {
                Ok(())
            } else {
                Err("stale".to_string())
            }
        };
        let found = cache.lookup("k", &target("A"), only_b);
        assert_eq!(found.source, LookupSource::CompatibleIsa);
        assert_eq!(found.record, Some(compatible));
        assert_eq!(found.warnings.len(), 2);

        let found = cache.lookup("k", &target("A"), |_: &Record| Err("no".to_string()));
        assert_eq!(found.source, LookupSource::Default);
        assert_eq!(found.record, None);
        assert_eq!(found.warnings.len(), 3);
    }

    #[test]
    fn non_finite_latency_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TuningCache::new(dir.path());
        let good = record("k", target("A"), 1e-3, 4);
        let mut lines = Vec::new();
        for latency in [f64::NAN, f64::INFINITY, -1.0, 0.0] {
            // serde_json writes the non-finite ones as `null`.
            lines.push(line(&record("k", target("A"), latency, 8)));
        }
        let mut huge = serde_json::to_value(&good).unwrap();
        huge["latency_s"] = serde_json::Value::String("fast".into());
        lines.push(huge.to_string());
        lines.push(line(&good));
        let path = write_lines(&cache, "x86_64-avx2", &lines);
        let found = cache.lookup("k", &target("A"), ok);
        assert_eq!(found.record, Some(good));
        let file = path.display().to_string();
        assert_eq!(found.warnings.len(), 5, "{:?}", found.warnings);
        assert!(found.warnings[0].starts_with(&format!("{file}:1: latency_s is not finite")));
        assert!(found.warnings[1].starts_with(&format!("{file}:2: latency_s is not finite")));
        assert!(found.warnings[2].starts_with(&format!("{file}:3: latency_s -1 is not")));
        assert!(found.warnings[3].starts_with(&format!("{file}:4: latency_s 0 is not")));
        assert!(found.warnings[4].starts_with(&format!("{file}:5: invalid record")));

        // append refuses what lookup would skip.
        for latency in [f64::NAN, f64::NEG_INFINITY, 0.0, -2.0] {
            let err = cache
                .append(&record("k", target("A"), latency, 8))
                .unwrap_err();
            assert!(matches!(err, CacheError::InvalidRecord(_)), "{err}");
        }
        let mut future = record("k", target("A"), 1.0, 8);
        future.version = 2;
        assert!(matches!(
            cache.append(&future),
            Err(CacheError::InvalidRecord(_))
        ));
        assert_eq!(fs::read_to_string(&path).unwrap().lines().count(), 6);
    }

    #[test]
    fn misfiled_record_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TuningCache::new(dir.path());
        let mut wrong = record("k", target("A"), 1e-3, 4);
        wrong.target.isa_class = "x86_64-avx512".into();
        write_lines(&cache, "x86_64-avx2", &[line(&wrong)]);
        let found = cache.lookup("k", &target("A"), ok);
        assert_eq!(found.source, LookupSource::Default);
        assert_eq!(found.warnings.len(), 1);
        assert!(found.warnings[0].contains("ISA class"));
        let (all, warnings) = cache.records("x86_64-avx2");
        assert!(all.is_empty());
        assert_eq!(warnings.len(), 1);
    }

    #[test]
    fn concurrent_appends_keep_every_line() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TuningCache::new(dir.path().join("cache"));
        std::thread::scope(|s| {
            for thread in 0..2 {
                let cache = cache.clone();
                s.spawn(move || {
                    for i in 0..50 {
                        let key = format!("t{thread}-{i}");
                        let latency = 1e-3 * (i + 1) as f64;
                        cache
                            .append(&record(&key, target("A"), latency, i + 1))
                            .unwrap();
                    }
                });
            }
        });
        let path = cache.path_for("x86_64-avx2");
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 100);
        let (all, warnings) = cache.records("x86_64-avx2");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(all.len(), 100);
        let mut keys: Vec<_> = all.iter().map(|r| r.workload_key.clone()).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), 100);
        for thread in 0..2 {
            let found = cache.lookup(&format!("t{thread}-49"), &target("A"), ok);
            assert_eq!(found.source, LookupSource::Exact);
            assert_eq!(found.record.unwrap().schedule, schedule(50));
        }
        // No temporary files are left behind.
        let leftovers: Vec<_> = fs::read_dir(&cache.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn missing_dir_or_file_is_default_without_warnings() {
        let dir = tempfile::tempdir().unwrap();
        let missing = TuningCache::new(dir.path().join("does/not/exist"));
        let found = missing.lookup("k", &target("A"), ok);
        assert_eq!(found.source, LookupSource::Default);
        assert_eq!(found.record, None);
        assert!(found.warnings.is_empty());
        assert_eq!(missing.records("x86_64-avx2"), (Vec::new(), Vec::new()));

        let empty = TuningCache::new(dir.path());
        let found = empty.lookup("k", &TargetFingerprint::host(), ok);
        assert_eq!(found.source, LookupSource::Default);
        assert!(found.warnings.is_empty());
    }

    #[test]
    fn unreadable_file_is_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TuningCache::new(dir.path());
        // A directory where the file should be: reading it fails with something other than
        // NotFound.
        fs::create_dir_all(cache.path_for("x86_64-avx2")).unwrap();
        let found = cache.lookup("k", &target("A"), ok);
        assert_eq!(found.source, LookupSource::Default);
        assert_eq!(found.warnings.len(), 1, "{:?}", found.warnings);
        assert!(matches!(
            cache.append(&record("k", target("A"), 1e-3, 4)),
            Err(CacheError::Io { .. })
        ));
    }

    #[test]
    fn isa_class_cannot_escape_the_directory() {
        let cache = TuningCache::new("/cache");
        assert_eq!(
            cache.path_for("x86_64-avx512"),
            PathBuf::from("/cache/x86_64-avx512.jsonl")
        );
        assert_eq!(
            cache.path_for("../../etc/x"),
            PathBuf::from("/cache/______etc_x.jsonl")
        );
        assert_eq!(cache.path_for(""), PathBuf::from("/cache/_.jsonl"));
    }
}
