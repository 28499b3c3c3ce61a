//! `cargo harl cache list|merge|verify|prune` (and `retime`, in its own module): tuning-cache files read with the same reader,
//! parser and limits as a build's lookup, written with the same lock and atomic rename as a
//! build's append. Text from a file is escaped before it is printed.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use harl_build::cache::{read_file, write_records, Record, TuningCache};
use harl_build::directive::escape;
use harl_build::lower::lower;
use harl_build::te::Graph;

use crate::CacheCommand;

/// Why a command could not run (a bad line is not an error: it is reported and counted).
#[derive(Debug, thiserror::Error)]
pub enum CacheToolError {
    /// A file could not be read as a cache file.
    #[error("{}: {why}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why (not a regular file, too large, I/O).
        why: String,
    },
    /// A file does not exist.
    #[error("{}: no such file", path.display())]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// Writing a file failed.
    #[error("{}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The error.
        source: harl_build::cache::CacheError,
    },
    /// A merge into one file of records of several ISA classes.
    #[error("records of several ISA classes ({0}) cannot share one file; give -o a directory")]
    MixedClasses(String),
    /// A retime failed.
    #[error(transparent)]
    Retime(#[from] super::retime::RetimeError),
    /// The crate's sources could not be scanned.
    #[error("{}: {source}", path.display())]
    Scan {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// One cache file as read: the ISA class its name gives (`x86_64-avx2.jsonl`; none for a file
/// named otherwise, such as a merge's output) and its numbered lines.
struct CacheFile {
    path: PathBuf,
    class: Option<String>,
    lines: Vec<harl_build::cache::NumberedLine>,
}

/// Whether a file stem is an ISA class name, as builds name their cache files.
fn names_a_class(stem: &str) -> bool {
    harl_build::target::cuda_capability(stem).is_some()
        || ["-baseline", "-avx2", "-avx512", "-neon"]
            .iter()
            .any(|s| stem.len() > s.len() && stem.ends_with(s))
}

impl CacheFile {
    fn load(path: &Path) -> Result<CacheFile, CacheToolError> {
        let lines = read_file(path)
            .map_err(|why| CacheToolError::Read {
                path: path.to_path_buf(),
                why,
            })?
            .ok_or_else(|| CacheToolError::Missing {
                path: path.to_path_buf(),
            })?;
        let class = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .filter(|s| names_a_class(s));
        Ok(CacheFile {
            path: path.to_path_buf(),
            class,
            lines,
        })
    }

    /// `file:line` for messages.
    fn at(&self, line: usize) -> String {
        format!("{}:{line}", self.path.display())
    }
}

/// Kernels to replay records on: workload key to graph.
type Kernels = HashMap<String, Graph>;

/// The kernels a crate declares in `src/` with `#[harl::kernel]`, found as its build script
/// finds them.
fn crate_kernels(dir: &Path) -> Result<Kernels, CacheToolError> {
    let mut decls = Vec::new();
    let src = dir.join("src");
    harl_build::scan::scan_path(&src, &mut decls)
        .map_err(|(path, source)| CacheToolError::Scan { path, source })?;
    Ok(decls
        .into_iter()
        .map(|d| (d.graph.workload_key(), d.graph))
        .collect())
}

/// What a record is worth: usable (replayed on a kernel or not), or not, and why.
enum Verdict {
    Usable { replayed: bool },
    Unusable(String),
}

/// Checks a parsed record of `file`: filed under its own ISA class (when the file's name is
/// one), and replaying on its kernel when `kernels` knows the workload.
fn judge(file: &CacheFile, record: &Record, kernels: Option<&Kernels>) -> Verdict {
    if let Some(class) = file
        .class
        .as_ref()
        .filter(|c| **c != record.target.isa_class)
    {
        return Verdict::Unusable(format!(
            "record is for ISA class {:?}, filed under {class:?}",
            record.target.isa_class
        ));
    }
    match kernels.and_then(|k| k.get(&record.workload_key)) {
        None => Verdict::Usable { replayed: false },
        Some(graph) => match lower(graph, &record.schedule) {
            Ok(_) => Verdict::Usable { replayed: true },
            Err(e) => Verdict::Unusable(format!("does not replay: {e}")),
        },
    }
}

/// The identity a merge or prune keeps one record of: workload and exact target.
fn identity(r: &Record) -> (String, String) {
    let target = serde_json::to_string(&r.target).unwrap_or_default();
    (r.workload_key.clone(), target)
}

/// Keeps the fastest record of each identity (the first on a tie), in a stable order:
/// by ISA class, workload key, target.
fn best_of(records: impl IntoIterator<Item = Record>) -> Vec<Record> {
    let mut best: BTreeMap<(String, (String, String)), Record> = BTreeMap::new();
    for r in records {
        let key = (r.target.isa_class.clone(), identity(&r));
        match best.get(&key) {
            Some(b) if b.latency_s <= r.latency_s => {}
            _ => {
                best.insert(key, r);
            }
        }
    }
    best.into_values().collect()
}

/// Runs one cache command.
pub fn run(cmd: CacheCommand) -> Result<ExitCode, CacheToolError> {
    match cmd {
        CacheCommand::List { files } => list(&files),
        CacheCommand::Merge { files, out } => merge(&files, &out),
        CacheCommand::Verify { files, krate } => verify(&files, krate.as_deref()),
        CacheCommand::Prune { files, krate } => prune(&files, krate.as_deref()),
        CacheCommand::Retime(args) => Ok(super::retime::run(args)?),
    }
}

fn list(files: &[PathBuf]) -> Result<ExitCode, CacheToolError> {
    for path in files {
        let file = CacheFile::load(path)?;
        for (line, parsed) in &file.lines {
            let text = match parsed {
                Ok(r) => format!(
                    "{}  {}  {}  {} ({})  {:.4} ms  {} trials  {}  harl {}",
                    file.at(*line),
                    r.workload,
                    r.workload_key.get(..16).unwrap_or(&r.workload_key),
                    r.target.isa_class,
                    r.target.cpu_model,
                    r.latency_s * 1e3,
                    r.trials,
                    if r.default_won {
                        "default won".to_string()
                    } else {
                        format!("{} steps", r.schedule.steps.len())
                    },
                    r.harl_version
                ),
                Err(e) => format!("{}  not a record: {e}", file.at(*line)),
            };
            println!("{}", escape(&text));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn merge(files: &[PathBuf], out: &Path) -> Result<ExitCode, CacheToolError> {
    // Every input is read before anything is written: the output may be one of them.
    let mut usable = Vec::new();
    let mut skipped = 0usize;
    for path in files {
        let file = CacheFile::load(path)?;
        for (line, parsed) in &file.lines {
            let why = match parsed {
                Ok(r) => match judge(&file, r, None) {
                    Verdict::Usable { .. } => {
                        usable.push(r.clone());
                        continue;
                    }
                    Verdict::Unusable(why) => why,
                },
                Err(e) => e.to_string(),
            };
            skipped += 1;
            eprintln!("{}", escape(&format!("{}: skipped: {why}", file.at(*line))));
        }
    }
    let merged = best_of(usable);
    let mut by_class: BTreeMap<String, Vec<Record>> = BTreeMap::new();
    for r in &merged {
        by_class
            .entry(r.target.isa_class.clone())
            .or_default()
            .push(r.clone());
    }
    let write = |path: &Path, records: &[Record]| {
        write_records(path, records).map_err(|source| CacheToolError::Write {
            path: path.to_path_buf(),
            source,
        })
    };
    if out.is_dir() {
        let cache = TuningCache::new(out);
        for (class, records) in &by_class {
            write(&cache.path_for(class), records)?;
        }
    } else if by_class.len() > 1 {
        let classes: Vec<&str> = by_class.keys().map(String::as_str).collect();
        return Err(CacheToolError::MixedClasses(classes.join(", ")));
    } else {
        write(out, &merged)?;
    }
    println!(
        "{}",
        escape(&format!(
            "merged {} records from {} files into {} ({skipped} lines skipped)",
            merged.len(),
            files.len(),
            out.display()
        ))
    );
    Ok(ExitCode::SUCCESS)
}

fn verify(files: &[PathBuf], krate: Option<&Path>) -> Result<ExitCode, CacheToolError> {
    let kernels = krate.map(crate_kernels).transpose()?;
    let (mut ok, mut replayed, mut failed) = (0usize, 0usize, 0usize);
    for path in files {
        let file = CacheFile::load(path)?;
        for (line, parsed) in &file.lines {
            let verdict = match parsed {
                Ok(r) => judge(&file, r, kernels.as_ref()),
                Err(e) => Verdict::Unusable(e.to_string()),
            };
            match verdict {
                Verdict::Usable { replayed: r } => {
                    ok += 1;
                    replayed += usize::from(r);
                }
                Verdict::Unusable(why) => {
                    failed += 1;
                    println!("{}", escape(&format!("{}: FAILED: {why}", file.at(*line))));
                }
            }
        }
    }
    let unchecked = match &kernels {
        Some(_) => format!(
            ", {} of workloads the crate does not declare (not replayed)",
            ok - replayed
        ),
        None => " (none replayed: give --crate DIR to replay them)".to_string(),
    };
    println!("{ok} records usable, {replayed} replayed{unchecked}; {failed} lines failed");
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn prune(files: &[PathBuf], krate: Option<&Path>) -> Result<ExitCode, CacheToolError> {
    let kernels = krate.map(crate_kernels).transpose()?;
    for path in files {
        let file = CacheFile::load(path)?;
        let mut usable = Vec::new();
        for (line, parsed) in &file.lines {
            let why = match parsed {
                Ok(r) => match judge(&file, r, kernels.as_ref()) {
                    Verdict::Usable { .. } => {
                        usable.push(r.clone());
                        continue;
                    }
                    Verdict::Unusable(why) => why,
                },
                Err(e) => e.to_string(),
            };
            println!("{}", escape(&format!("{}: dropped: {why}", file.at(*line))));
        }
        let before = usable.len();
        let kept = best_of(usable);
        write_records(path, &kept).map_err(|source| CacheToolError::Write {
            path: path.to_path_buf(),
            source,
        })?;
        println!(
            "{}",
            escape(&format!(
                "{}: kept {} records ({} superseded, {} lines dropped)",
                path.display(),
                kept.len(),
                before - kept.len(),
                file.lines.len() - before
            ))
        );
    }
    Ok(ExitCode::SUCCESS)
}
