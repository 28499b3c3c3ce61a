//! The measured-trial dataset a cost model is warm-started from: workloads (their graphs) and
//! every schedule measured on them with its latency, on one machine class. Schedules, not
//! features, are stored, so features can change without regenerating the data.
//!
//! The file is gzipped JSON lines: a [`DatasetHeader`], then one [`DatasetWorkload`] a line.
//! `harl-bench dataset` makes it; [`Dataset::shipped`] are the ones in this crate, one per ISA
//! class (`data/dataset-<isa-class>.jsonl.gz`), compiled in. Reading checks a size cap, the version and every
//! graph, so a hand-made file given with `--dataset` gets a clear error, not a panic.

use super::{gz, CostModelError};
use crate::features;
use harl_build::lower::lower;
use harl_build::schedule::Schedule;
use harl_build::target::TargetFingerprint;
use harl_te::Graph;
use serde::{Deserialize, Serialize};
use std::io::BufRead;
use std::path::Path;
use std::sync::OnceLock;

/// The dataset format this harl reads and writes.
pub const DATASET_VERSION: u32 = 1;
/// The largest dataset (uncompressed) a reader accepts.
pub const MAX_DATASET_BYTES: u64 = 256 << 20;

/// The shipped datasets, gzipped, by the ISA class they were measured on.
pub const SHIPPED: [(&str, &[u8]); 2] = [
    (
        "x86_64-avx512",
        include_bytes!("../../data/dataset-x86_64-avx512.jsonl.gz"),
    ),
    (
        "x86_64-avx2",
        include_bytes!("../../data/dataset-x86_64-avx2.jsonl.gz"),
    ),
];

/// The first line of a dataset.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DatasetHeader {
    /// [`DATASET_VERSION`].
    pub version: u32,
    /// The machine the trials were measured on.
    pub target: TargetFingerprint,
    /// Threads the kernels ran on.
    pub threads: usize,
    /// How it was made (command, budget, date).
    pub note: String,
}

/// One workload and its measured trials.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DatasetWorkload {
    /// A name for reports.
    pub name: String,
    /// The graph.
    pub graph: Graph,
    /// Every measured schedule, in the order measured.
    pub trials: Vec<DatasetTrial>,
}

/// One measured schedule.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DatasetTrial {
    /// The schedule.
    pub schedule: Schedule,
    /// Its median latency, or `None` if the trial failed.
    pub latency_s: Option<f64>,
}

/// A dataset: its header and workloads.
#[derive(Clone, Debug)]
pub struct Dataset {
    /// The header.
    pub header: DatasetHeader,
    /// The workloads.
    pub workloads: Vec<DatasetWorkload>,
}

/// One measured schedule as a model sees it: its features and latency (`None`: it failed).
pub type Measured = (Vec<f32>, Option<f64>);

/// Cost-model training rows: features, throughput normalised per group, group ids.
#[derive(Clone, Debug, Default)]
pub struct Rows {
    /// Feature vectors.
    pub features: Vec<Vec<f32>>,
    /// Throughput relative to the group's best (0 for failed trials).
    pub throughput: Vec<f64>,
    /// Group (workload) of each row.
    pub groups: Vec<usize>,
}

impl Rows {
    /// Appends one group's trials: `(features, latency)` pairs, normalised by the group's best.
    /// A group with no successful trial adds nothing.
    pub fn push_group(&mut self, trials: impl IntoIterator<Item = Measured>) {
        let trials: Vec<Measured> = trials.into_iter().collect();
        let Some(best) = trials.iter().filter_map(|t| t.1).reduce(f64::min) else {
            return;
        };
        let group = self.groups.last().map_or(0, |g| g + 1);
        for (f, l) in trials {
            self.features.push(f);
            self.throughput.push(l.map_or(0.0, |l| best / l));
            self.groups.push(group);
        }
    }

    /// Appends `other`'s groups after this one's.
    pub fn append(&mut self, other: Rows) {
        let base = self.groups.last().map_or(0, |g| g + 1);
        self.features.extend(other.features);
        self.throughput.extend(other.throughput);
        self.groups
            .extend(other.groups.into_iter().map(|g| g + base));
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.features.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.features.is_empty()
    }
}

impl Dataset {
    /// Writes the dataset gzipped.
    pub fn write(&self, path: &Path) -> Result<(), CostModelError> {
        let err = |e: serde_json::Error| gz::records_error(path, e);
        let mut text = serde_json::to_string(&self.header).map_err(err)? + "\n";
        for w in &self.workloads {
            text += &(serde_json::to_string(w).map_err(err)? + "\n");
        }
        gz::write(path, &text)
    }

    /// Reads a gzipped dataset file.
    pub fn read(path: &Path) -> Result<Dataset, CostModelError> {
        Dataset::from_gz(&gz::read(path)?, path)
    }

    /// Parses gzipped dataset bytes (`path` names them in errors).
    pub fn from_gz(bytes: &[u8], path: &Path) -> Result<Dataset, CostModelError> {
        let bad = |why: String| gz::records_error(path, why);
        let text = gz::text(bytes, MAX_DATASET_BYTES, path)?;
        let mut lines = text.as_bytes().lines();
        let header: DatasetHeader = match lines.next() {
            Some(Ok(l)) => serde_json::from_str(&l).map_err(|e| bad(format!("header: {e}")))?,
            _ => return Err(bad("empty".into())),
        };
        if header.version != DATASET_VERSION {
            return Err(bad(format!(
                "dataset version {} (this harl reads {DATASET_VERSION})",
                header.version
            )));
        }
        let mut workloads = Vec::new();
        for (i, line) in lines.enumerate() {
            let line = line.map_err(|e| bad(e.to_string()))?;
            if line.trim().is_empty() {
                continue;
            }
            let w: DatasetWorkload =
                serde_json::from_str(&line).map_err(|e| bad(format!("line {}: {e}", i + 2)))?;
            w.graph
                .validate()
                .map_err(|e| bad(format!("line {}: workload `{}`: {e}", i + 2, w.name)))?;
            workloads.push(w);
        }
        Ok(Dataset { header, workloads })
    }

    /// The shipped datasets, parsed once, in [`SHIPPED`]'s order (`None` for one that does
    /// not parse, which a test rules out).
    pub fn shipped() -> &'static [Option<Dataset>] {
        static PARSED: OnceLock<Vec<Option<Dataset>>> = OnceLock::new();
        PARSED.get_or_init(|| {
            SHIPPED
                .iter()
                .map(|(class, bytes)| {
                    let name = format!("data/dataset-{class}.jsonl.gz");
                    Dataset::from_gz(bytes, Path::new(&name)).ok()
                })
                .collect()
        })
    }

    /// Number of measured trials.
    pub fn trials(&self) -> usize {
        self.workloads.iter().map(|w| w.trials.len()).sum()
    }

    /// Training rows: every trial whose schedule lowers on its workload (features of today's
    /// feature set), a group per workload.
    pub fn rows(&self) -> Rows {
        let mut rows = Rows::default();
        for w in &self.workloads {
            rows.push_group(w.trials.iter().filter_map(|t| {
                let program = lower(&w.graph, &t.schedule).ok()?;
                Some((features::extract(&program), t.latency_s))
            }));
        }
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use harl_build::default_schedule::{default_schedule, CpuTarget};
    use harl_te::ops::workloads;

    fn tiny() -> Dataset {
        let graph = workloads::matmul(8, 8, 8).expect("mm");
        let schedule = default_schedule(&graph, &CpuTarget::portable());
        Dataset {
            header: DatasetHeader {
                version: DATASET_VERSION,
                target: TargetFingerprint::host(),
                threads: 1,
                note: "test".into(),
            },
            workloads: vec![DatasetWorkload {
                name: "mm".into(),
                graph,
                trials: vec![
                    DatasetTrial {
                        schedule: schedule.clone(),
                        latency_s: Some(2e-6),
                    },
                    DatasetTrial {
                        schedule: Schedule::naive(),
                        latency_s: Some(4e-6),
                    },
                    DatasetTrial {
                        schedule,
                        latency_s: None,
                    },
                ],
            }],
        }
    }

    #[test]
    fn a_dataset_round_trips_and_gives_normalised_rows() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("d.jsonl.gz");
        tiny().write(&path).expect("write");
        let back = Dataset::read(&path).expect("read");
        assert_eq!(back.trials(), 3);
        let rows = back.rows();
        assert_eq!(rows.throughput, vec![1.0, 0.5, 0.0]);
        assert_eq!(rows.groups, vec![0, 0, 0]);
    }

    #[test]
    fn bad_files_are_errors_that_say_why() {
        let p = Path::new("x");
        let gz = |text: &str| {
            use std::io::Write;
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(text.as_bytes()).expect("gz");
            e.finish().expect("gz")
        };
        let why = |bytes: &[u8]| Dataset::from_gz(bytes, p).expect_err("bad").to_string();
        assert!(why(b"not gzip").contains("gzipped"));
        assert!(why(&gz("")).contains("empty"));
        let mut header = serde_json::to_value(&tiny().header).expect("json");
        header["version"] = 99.into();
        assert!(why(&gz(&header.to_string())).contains("version 99"));
        let ok_header = serde_json::to_string(&tiny().header).expect("json");
        assert!(why(&gz(&format!("{ok_header}\n{{\"name\": 1}}"))).contains("line 2"));
        // A graph that does not validate (an input with a zero extent) is refused.
        let mut w = serde_json::to_value(&tiny().workloads[0]).expect("json");
        w["graph"]["inputs"][0]["shape"][0] = 0.into();
        let e = why(&gz(&format!("{ok_header}\n{w}")));
        assert!(e.contains("line 2"), "{e}");
    }
}
