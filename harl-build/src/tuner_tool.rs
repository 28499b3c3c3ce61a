//! The build script's side of `HARL_TUNE=on`: it finds the installed tuner (`cargo-harl`, on
//! `PATH` or named by `HARL_TUNER`), hands it the build's manifest, streams its output to a log
//! in `OUT_DIR` (and to stderr, which `cargo build -vv` shows live) and reads back what it did.
//! The tuning stack (XGBoost, burn) lives in that tool, never in a consumer's build.

use crate::directive::escape;
use crate::manifest::TuneOutcome;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

/// The tuner's executable name.
pub const TUNER_BIN: &str = "cargo-harl";

/// The tuner to call: `HARL_TUNER` when set, else `cargo-harl` on `PATH`, else in
/// `$CARGO_HOME/bin` (where `cargo install` puts it).
pub fn find_tuner() -> Option<PathBuf> {
    if let Some(t) = std::env::var_os("HARL_TUNER").filter(|t| !t.is_empty()) {
        return Some(PathBuf::from(t));
    }
    let exe = format!("{TUNER_BIN}{}", std::env::consts::EXE_SUFFIX);
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(&exe));
    let cargo_home = crate::builder::cargo_home().map(|home| home.join("bin").join(&exe));
    on_path.chain(cargo_home).find(|p| p.is_file())
}

/// Runs `tuner harl tune --manifest M --results R`, its output appended line by line to `log`
/// and echoed (escaped) to stderr. Returns the outcomes it wrote, or why there are none.
pub fn run_tuner(
    tuner: &Path,
    manifest: &Path,
    results: &Path,
    log: &Path,
) -> Result<Vec<TuneOutcome>, String> {
    let _ = std::fs::remove_file(results);
    let log_file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let log_file = Arc::new(Mutex::new(log_file));
    let mut child = Command::new(tuner)
        .args(["harl", "tune", "--manifest"])
        .arg(manifest)
        .arg("--results")
        .arg(results)
        // Builds the tuner starts (the crate's own, measurement workers) must not call it again.
        .env("HARL_TUNE", "cache")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", tuner.display()))?;
    let pump = |stream: Box<dyn Read + Send>, log: Arc<Mutex<std::fs::File>>| {
        std::thread::spawn(move || {
            for line in BufReader::new(stream).split(b'\n').map_while(Result::ok) {
                let line = String::from_utf8_lossy(&line);
                let line = escape(line.trim_end_matches('\r'));
                if let Ok(mut f) = log.lock() {
                    let _ = writeln!(f, "{line}");
                }
                eprintln!("harl tune: {line}");
            }
        })
    };
    let pumps = [
        child
            .stdout
            .take()
            .map(|s| pump(Box::new(s), log_file.clone())),
        child
            .stderr
            .take()
            .map(|s| pump(Box::new(s), log_file.clone())),
    ];
    let status = child.wait().map_err(|e| e.to_string())?;
    for p in pumps.into_iter().flatten() {
        let _ = p.join();
    }
    // A tune where some kernel failed exits non-zero but still reports the others.
    match std::fs::read_to_string(results) {
        Ok(text) => serde_json::from_str(&text)
            .map_err(|e| format!("the tuner's results are unreadable: {e}")),
        Err(_) => Err(format!(
            "the tuner failed ({status}); its output is in {}",
            log.display()
        )),
    }
}
