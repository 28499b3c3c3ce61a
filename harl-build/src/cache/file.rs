//! Cache files on disk: capped reads of regular files only, and appends under a lock that
//! replace the file atomically and clean up after killed writers.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use super::record::{check_latency, parse_record, RecordError};
use super::{CacheError, Record, TuningCache, RECORD_VERSION};
use crate::limits::{MAX_CACHE_FILE_BYTES, MAX_RECORD_LINE_BYTES};

impl TuningCache {
    /// Appends `record` to the file of its target's ISA class and returns that file's path.
    ///
    /// Creates the directory if needed and rewrites the file under its lock (see
    /// [`write_records`]); existing lines, even corrupt ones, are kept verbatim. A record that
    /// a lookup would reject (another [`RECORD_VERSION`], a latency that is not finite and
    /// positive) is refused.
    pub fn append(&self, record: &Record) -> Result<PathBuf, CacheError> {
        check_writable(record)?;
        let line = serde_json::to_string(record)?;
        fs::create_dir_all(&self.dir).map_err(io_err(&self.dir))?;
        let path = self.path_for(&record.target.isa_class);
        rewrite_locked(&path, |mut content| {
            if content.last().is_some_and(|&b| b != b'\n') {
                content.push(b'\n');
            }
            content.extend_from_slice(line.as_bytes());
            content.push(b'\n');
            content
        })?;
        Ok(path)
    }
}

/// Replaces the file at `path` with `records`, one line each, under the same lock and atomic
/// rename as [`TuningCache::append`] (the tool's merge and prune). Every record is checked as
/// `append` checks it first.
pub fn write_records(path: &Path, records: &[Record]) -> Result<(), CacheError> {
    let mut text = String::new();
    for record in records {
        check_writable(record)?;
        text.push_str(&serde_json::to_string(record)?);
        text.push('\n');
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
    }
    rewrite_locked(path, |_| text.into_bytes())
}

/// Refuses what a lookup would skip.
fn check_writable(record: &Record) -> Result<(), CacheError> {
    if record.version != RECORD_VERSION {
        return Err(CacheError::InvalidRecord(format!(
            "version {} (this crate writes version {RECORD_VERSION})",
            record.version
        )));
    }
    check_latency(record.latency_s).map_err(CacheError::InvalidRecord)
}

/// Holds an exclusive lock on `<path>.lock` for a read-modify-write of `path` (so concurrent
/// writers serialize), removes temporary files killed writers left, and writes what `change`
/// makes of the current content to a temporary file in the same directory, fsyncs it and
/// renames it over `path`.
fn rewrite_locked(path: &Path, change: impl FnOnce(Vec<u8>) -> Vec<u8>) -> Result<(), CacheError> {
    let lock_path = sidecar(path, ".lock");
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(io_err(&lock_path))?;
    lock.lock().map_err(io_err(&lock_path))?;

    // The lock is released when `lock` is closed, on every return path below.
    remove_stale_temps(path);
    let content = read_capped(path, MAX_CACHE_FILE_BYTES)
        .map_err(|why| io_err(path)(io::Error::other(why)))?
        .unwrap_or_default();
    let content = change(content);

    let tmp_path = sidecar(path, &format!(".{}.tmp", std::process::id()));
    let written = write_synced(&tmp_path, &content)
        .and_then(|()| fs::rename(&tmp_path, path).map_err(io_err(path)));
    if let Err(e) = written {
        // Best effort: do not leave the temporary file behind.
        let _ = fs::remove_file(&tmp_path);
        return Err(e);
    }
    if let Some(dir) = path.parent() {
        sync_dir(dir);
    }
    drop(lock);
    Ok(())
}

/// One line of a cache file: its number (from 1) and what it parsed as.
pub type NumberedLine = (usize, Result<Record, RecordError>);

/// Every non-blank line of a cache file, numbered from 1, parsed: `Ok(None)` when the file
/// does not exist, an error when it cannot be read as a cache file (not a regular file, over
/// [`MAX_CACHE_FILE_BYTES`], an I/O error). Lines over [`MAX_RECORD_LINE_BYTES`] are errors
/// unparsed.
pub fn read_file(path: &Path) -> Result<Option<Vec<NumberedLine>>, String> {
    let Some(bytes) = read_capped(path, MAX_CACHE_FILE_BYTES)? else {
        return Ok(None);
    };
    let lines = bytes
        .split(|&b| b == b'\n')
        .enumerate()
        .filter(|(_, raw)| !raw.trim_ascii().is_empty())
        .map(|(i, raw)| {
            let parsed = if raw.len() > MAX_RECORD_LINE_BYTES {
                Err(RecordError {
                    key: None,
                    reason: format!(
                        "line of {} bytes exceeds the limit of {MAX_RECORD_LINE_BYTES}",
                        raw.len()
                    ),
                })
            } else {
                parse_record(raw)
            };
            (i + 1, parsed)
        })
        .collect();
    Ok(Some(lines))
}

/// [`read_file`] for lookups: a file that cannot be read is one warning and no lines.
pub(crate) fn read_lines(path: &Path, warnings: &mut Vec<String>) -> Vec<NumberedLine> {
    match read_file(path) {
        Ok(lines) => lines.unwrap_or_default(),
        Err(why) => {
            warnings.push(format!("{}: not read: {why}", path.display()));
            Vec::new()
        }
    }
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
