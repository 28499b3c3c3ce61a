//! Cache files on disk: capped reads of regular files only, and appends under a lock that
//! replace the file atomically and clean up after killed writers.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use super::record::{check_latency, parse_record, RecordError};
use super::{CacheError, Record, TuningCache, RECORD_VERSION};
use crate::limits::{MAX_CACHE_FILE_BYTES, MAX_RECORD_LINE_BYTES};

/// What one line of a cache file turned out to be.
pub(crate) enum Line {
    /// A well-formed record of the current version with a valid latency.
    Valid(Record),
    /// A line to skip; `key` is its workload key where one could be read.
    Bad { key: Option<String>, reason: String },
}

impl TuningCache {
    /// Appends `record` to the file of its target's ISA class and returns that file's path.
    ///
    /// Creates the directory if needed, holds an exclusive lock on `<file>.lock` for the whole
    /// read-modify-write (so concurrent builds serialize), and writes the old content plus the
    /// new line to a temporary file in the same directory, fsyncs it and renames it over the
    /// file. Existing lines, even corrupt ones, are kept verbatim. A record that a lookup would
    /// reject (another [`RECORD_VERSION`], a latency that is not finite and positive) is refused.
    pub fn append(&self, record: &Record) -> Result<PathBuf, CacheError> {
        if record.version != RECORD_VERSION {
            return Err(CacheError::InvalidRecord(format!(
                "version {} (this crate writes version {RECORD_VERSION})",
                record.version
            )));
        }
        if let Err(reason) = check_latency(record.latency_s) {
            return Err(CacheError::InvalidRecord(reason));
        }
        let line = serde_json::to_string(record)?;

        fs::create_dir_all(&self.dir).map_err(io_err(&self.dir))?;
        let path = self.path_for(&record.target.isa_class);
        let lock_path = sidecar(&path, ".lock");
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(io_err(&lock_path))?;
        lock.lock().map_err(io_err(&lock_path))?;

        // The lock is released when `lock` is closed, on every return path below.
        remove_stale_temps(&path);
        let mut content = read_capped(&path, MAX_CACHE_FILE_BYTES)
            .map_err(|why| io_err(&path)(io::Error::other(why)))?
            .unwrap_or_default();
        if content.last().is_some_and(|&b| b != b'\n') {
            content.push(b'\n');
        }
        content.extend_from_slice(line.as_bytes());
        content.push(b'\n');

        let tmp_path = sidecar(&path, &format!(".{}.tmp", std::process::id()));
        let written = write_synced(&tmp_path, &content)
            .and_then(|()| fs::rename(&tmp_path, &path).map_err(io_err(&path)));
        if let Err(e) = written {
            // Best effort: do not leave the temporary file behind.
            let _ = fs::remove_file(&tmp_path);
            return Err(e);
        }
        sync_dir(&self.dir);
        drop(lock);
        Ok(path)
    }
}

/// Reads `path` and classifies its non-blank lines, numbered from 1. A missing file yields
/// nothing; any other read error is pushed to `warnings`.
pub(crate) fn read_lines(path: &Path, warnings: &mut Vec<String>) -> Vec<(usize, Line)> {
    let bytes = match read_capped(path, MAX_CACHE_FILE_BYTES) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Vec::new(),
        Err(why) => {
            warnings.push(format!("{}: not read: {why}", path.display()));
            return Vec::new();
        }
    };
    bytes
        .split(|&b| b == b'\n')
        .enumerate()
        .filter(|(_, raw)| !raw.trim_ascii().is_empty())
        .map(|(i, raw)| {
            let line = if raw.len() > MAX_RECORD_LINE_BYTES {
                Line::Bad {
                    key: None,
                    reason: format!(
                        "line of {} bytes exceeds the limit of {MAX_RECORD_LINE_BYTES}",
                        raw.len()
                    ),
                }
            } else {
                parse_line(raw)
            };
            (i + 1, line)
        })
        .collect()
}

/// Reads a cache file of at most `cap` bytes: `Ok(None)` when it does not exist, an error
/// when it is not a regular file (a FIFO would block the build, a device could be endless)
/// or is larger than `cap`. The type is checked before opening (opening a FIFO blocks) and
/// again on the opened file, and the read itself stops past `cap`, so a file that grows or is
/// swapped meanwhile is still bounded.
pub fn read_capped(path: &Path, cap: u64) -> Result<Option<Vec<u8>>, String> {
    let regular = |m: &fs::Metadata| {
        if m.is_file() {
            Ok(())
        } else {
            Err("not a regular file".to_string())
        }
    };
    match fs::metadata(path) {
        Ok(m) => regular(&m)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    }
    let file = File::open(path).map_err(|e| e.to_string())?;
    regular(&file.metadata().map_err(|e| e.to_string())?)?;
    let mut bytes = Vec::new();
    file.take(cap.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > cap {
        return Err(format!("larger than the limit of {cap} bytes"));
    }
    Ok(Some(bytes))
}

/// Classifies one line.
fn parse_line(raw: &[u8]) -> Line {
    match parse_record(raw) {
        Ok(record) => Line::Valid(record),
        Err(RecordError { key, reason }) => Line::Bad { key, reason },
    }
}

/// Removes temporary files that appends of `path` left behind when killed between writing
/// and renaming. Called with the lock held: no live writer has a temporary file then.
fn remove_stale_temps(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return;
    };
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let prefix = format!("{name}.");
    for entry in entries.filter_map(Result::ok) {
        let file = entry.file_name();
        let Some(file) = file.to_str() else { continue };
        let stale = file
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix(".tmp"))
            .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
        if stale {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// `path` with `suffix` appended to its file name.
fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Maps an I/O error to [`CacheError::Io`] for `path`.
fn io_err(path: &Path) -> impl Fn(io::Error) -> CacheError + '_ {
    move |source| CacheError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `content` to a fresh `path` and fsyncs it.
fn write_synced(path: &Path, content: &[u8]) -> Result<(), CacheError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(io_err(path))?;
    file.write_all(content).map_err(io_err(path))?;
    file.sync_all().map_err(io_err(path))
}

/// Best effort: makes a rename in `dir` durable (Unix only; directories cannot be opened
/// as files elsewhere).
fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}
