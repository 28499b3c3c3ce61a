//! A record: one tuned schedule of one workload on one target, as one JSON line, and its
//! parser. Parsing checks the format (version, fields, latency); whether the schedule replays
//! on its workload is the lookup's check.

use serde::{Deserialize, Serialize};

use crate::schedule::Schedule;
use crate::target::TargetFingerprint;

/// The record format version this crate reads and writes. Lines with another version are
/// skipped with a warning.
pub const RECORD_VERSION: u32 = 1;

/// One tuning result: the best schedule found for a workload on a target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The record format version; [`RECORD_VERSION`] for records this crate writes.
    pub version: u32,
    /// The workload key (a stable hash of the lowered te graph).
    pub workload_key: String,
    /// A human-readable name or description of the workload.
    pub workload: String,
    /// The machine the schedule was measured on.
    pub target: TargetFingerprint,
    /// The tuned schedule.
    pub schedule: Schedule,
    /// The measured latency in seconds (finite and positive).
    pub latency_s: f64,
    /// How many candidate schedules were measured to find this one.
    pub trials: u64,
    /// The harl version that wrote the record.
    pub harl_version: String,
    /// The tune found nothing faster than the default schedule of its harl (`schedule` is that
    /// default). A build then uses its own harl's default, so that a record does not pin an
    /// older, weaker default in place once the heuristics improve; the record still says the
    /// workload was tuned on its target. Absent (false) in older records, which keep their
    /// schedule.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default_won: bool,
}

impl Record {
    /// A record of the current [`RECORD_VERSION`], stamped with this crate's version.
    pub fn new(
        workload_key: impl Into<String>,
        workload: impl Into<String>,
        target: TargetFingerprint,
        schedule: Schedule,
        latency_s: f64,
        trials: u64,
    ) -> Self {
        Record {
            version: RECORD_VERSION,
            workload_key: workload_key.into(),
            workload: workload.into(),
            target,
            schedule,
            latency_s,
            trials,
            harl_version: env!("CARGO_PKG_VERSION").to_string(),
            default_won: false,
        }
    }

    /// This record marked as the default schedule's (see [`Record::default_won`]).
    pub fn with_default_won(mut self, won: bool) -> Self {
        self.default_won = won;
        self
    }
}

/// Why one cache line is not a usable record.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{reason}")]
pub struct RecordError {
    /// The line's workload key, where one could be read (so that lookups of other workloads
    /// can skip the line silently).
    pub key: Option<String>,
    /// What is wrong. It may quote text from the line: escape it before printing it anywhere
    /// a reader parses (see [`crate::directive`]).
    pub reason: String,
}

/// Parses one cache line into a [`Record`] of the current [`RECORD_VERSION`] with a finite,
/// positive latency. The version is read from the raw JSON first, so a future record with a
/// different shape reports its version rather than a parse error. The schedule is not checked
/// against any graph here: that is [`crate::lower::lower`]'s job, at lookup.
pub fn parse_record(raw: &[u8]) -> Result<Record, RecordError> {
    let value: serde_json::Value = serde_json::from_slice(raw).map_err(|e| RecordError {
        key: None,
        reason: format!("invalid JSON: {e}"),
    })?;
    let key = value
        .get("workload_key")
        .and_then(|k| k.as_str())
        .map(str::to_string);
    let bad = |reason: String| RecordError {
        key: key.clone(),
        reason,
    };
    match value.get("version") {
        Some(v) if v.as_u64() == Some(u64::from(RECORD_VERSION)) => {}
        Some(v) => return Err(bad(format!("unknown record version {v}"))),
        None => return Err(bad("record has no version".to_string())),
    }
    match value.get("latency_s") {
        // serde_json writes NaN and infinities as `null`.
        Some(serde_json::Value::Null) => {
            return Err(bad("latency_s is not finite (null)".to_string()));
        }
        Some(serde_json::Value::Number(n)) => {
            check_latency(n.as_f64().unwrap_or(f64::NAN)).map_err(bad)?;
        }
        _ => {} // Missing or mistyped: reported by the full parse below.
    }
    let record =
        serde_json::from_value::<Record>(value).map_err(|e| bad(format!("invalid record: {e}")))?;
    check_latency(record.latency_s).map_err(bad)?;
    Ok(record)
}

/// A latency is usable when finite and positive.
pub(crate) fn check_latency(latency_s: f64) -> Result<(), String> {
    if latency_s.is_finite() && latency_s > 0.0 {
        Ok(())
    } else {
        Err(format!(
            "latency_s {latency_s} is not a finite positive number"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record::new(
            "k",
            "w",
            TargetFingerprint::host(),
            Schedule::default(),
            1e-3,
            8,
        )
    }

    #[test]
    fn the_default_won_mark_round_trips_and_is_absent_from_older_lines() {
        let plain = serde_json::to_string(&record()).expect("serialize");
        // Unmarked records are written as before, so older harls read them unchanged.
        assert!(!plain.contains("default_won"), "{plain}");
        assert!(!parse_record(plain.as_bytes()).expect("parse").default_won);
        let marked = serde_json::to_string(&record().with_default_won(true)).expect("serialize");
        assert!(marked.contains("\"default_won\":true"), "{marked}");
        assert!(parse_record(marked.as_bytes()).expect("parse").default_won);
        let wrong = marked.replace("\"default_won\":true", "\"default_won\":\"yes\"");
        assert!(parse_record(wrong.as_bytes()).is_err());
    }
}
