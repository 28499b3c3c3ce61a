//! `harl-bench summarize DIR`: one markdown table from the `summary.json` files under `DIR`
//! (as `scripts/suite.sh` leaves them), for notes and docs.

use crate::Error;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The `DIR/*/summary.json` files, sorted by path.
pub fn summary_files(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path().join("summary.json"))
        .filter(|p| p.is_file())
        .collect();
    entries.sort();
    Ok(entries)
}

/// The table's rows, one per `DIR/*/summary.json`, in directory order.
pub fn table(dir: &Path) -> Result<String, Error> {
    let entries = summary_files(dir)?;
    if entries.is_empty() {
        return Err(format!("no */summary.json under {}", dir.display()).into());
    }
    let mut out = String::from(
        "| workload | strategy | threads | trials | GFLOP/s | default GFLOP/s | tuned/default | peer GFLOP/s | tuned/peer | tune wall s | trials/s | failed | best is a default seed |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for path in entries {
        let text = std::fs::read_to_string(&path)?;
        let v: Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        out.push_str(&row(&v));
        out.push('\n');
    }
    Ok(out)
}

fn row(v: &Value) -> String {
    let num = |k: &str| v[k].as_f64();
    let f1 = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.1}"));
    let f2 = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2}"));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let gflops = num("gflops");
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        v["workload"].as_str().unwrap_or("?"),
        v["strategy"].as_str().unwrap_or("?"),
        v["threads"],
        v["trials"],
        f1(gflops),
        f1(num("default_gflops")),
        f2(ratio(gflops, num("default_gflops"))),
        f1(num("peer_gflops")),
        f2(ratio(gflops, num("peer_gflops"))),
        f1(num("tune_wall_s")),
        f2(num("trials_per_s")),
        v["failed_trials"],
        v["best_is_default_seed"]
            .as_bool()
            .map_or("-", |b| if b { "yes" } else { "no" }),
    )
}

/// Prints the table.
pub fn run(dir: &Path) -> Result<(), Error> {
    print!("{}", table(dir)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_per_summary_with_ratios() {
        let dir = std::env::temp_dir().join(format!("harl-summarize-{}", std::process::id()));
        let w = dir.join("gemm_128");
        std::fs::create_dir_all(&w).expect("dir");
        let summary = r#"{"workload":"gemm_128","strategy":"ansor","threads":1,"trials":1000,
            "gflops":110.0,"default_gflops":100.0,"peer_gflops":55.0,"tune_wall_s":300.0,
            "trials_per_s":3.33,"failed_trials":0,"best_is_default_seed":false}"#;
        std::fs::write(w.join("summary.json"), summary).expect("write");
        let t = table(&dir).expect("table");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            t.contains("| gemm_128 | ansor | 1 | 1000 | 110.0 | 100.0 | 1.10 | 55.0 | 2.00 | 300.0 | 3.33 | 0 | no |"),
            "{t}"
        );
        assert!(table(Path::new("/nonexistent-harl-dir")).is_err());
    }
}
