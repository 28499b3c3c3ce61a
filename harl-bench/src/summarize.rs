//! `harl-bench summarize DIR`: one markdown table from the `summary.json` files under `DIR`
//! (as `scripts/suite.sh` leaves them), for notes and docs.

use crate::stats::median;
use crate::Error;
use serde_json::Value;
use std::collections::BTreeMap;
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

/// The `DIR/*/compare.json` files that hold `strategy` and a baseline, sorted by path.
fn compare_files(dir: &Path) -> Result<Vec<(PathBuf, Value)>, Error> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let path = entry?.path().join("compare.json");
        if !path.is_file() {
            continue;
        }
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        out.push((path, v));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// One markdown row per `DIR/*/compare.json`: `strategy` against the baseline there (medians
/// over seeds), and a last row with the geometric means of the ratios.
pub fn compare_table(dir: &Path, strategy: &str) -> Result<String, Error> {
    let files = compare_files(dir)?;
    if files.is_empty() {
        return Err(format!("no */compare.json under {}", dir.display()).into());
    }
    let mut out = format!(
        "| workload | seeds | trials | {strategy} GFLOP/s | baseline GFLOP/s | final ratio | re-timed ratio | {strategy} trials to baseline best | baseline trials | trials ratio | {strategy} trials to 99% | baseline trials to 99% | 99% ratio | {strategy} wall s | baseline wall s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    let mut logs: [Vec<f64>; 4] = Default::default();
    for (path, v) in files {
        let base_name = v["baseline"].as_str().unwrap_or("ansor");
        let (ours, base) = (&v["strategies"][strategy], &v["strategies"][base_name]);
        if ours.is_null() || base.is_null() {
            return Err(format!("{}: no `{strategy}` or `{base_name}` run", path.display()).into());
        }
        let pair = |k: &str| (ours[k].as_f64(), base[k].as_f64());
        let ratio = |(a, b): (Option<f64>, Option<f64>)| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        // `never` where a run has the figure as null (it never got there), `-` where the
        // file predates the figure.
        let f = |x: Option<f64>, d: usize| x.map_or("never".to_string(), |x| format!("{x:.d$}"));
        let cell = |side: &Value, k: &str, d: usize| match side.get(k) {
            None => "-".to_string(),
            Some(x) => f(x.as_f64(), d),
        };
        let rcell = |k: &str, r: Option<f64>| match (ours.get(k), base.get(k)) {
            (Some(_), Some(_)) => f(r, 2),
            _ => "-".to_string(),
        };
        let (fin, reach, near) = (
            pair("final_gflops"),
            pair("trials_to_reach_baseline"),
            pair("trials_to_reach_99pct_baseline"),
        );
        let retimed = retimed_ratio(&path.with_file_name("retime.json"), strategy)?;
        let ratios = [ratio(fin), retimed, ratio(reach), ratio(near)];
        for (log, r) in logs.iter_mut().zip(ratios) {
            if let Some(r) = r {
                log.push(r.ln());
            }
        }
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            v["workload"].as_str().unwrap_or("?"),
            v["seeds"].as_array().map_or(0, Vec::len),
            v["trials"],
            cell(ours, "final_gflops", 1),
            cell(base, "final_gflops", 1),
            rcell("final_gflops", ratios[0]),
            retimed.map_or("-".to_string(), |r| format!("{r:.2}")),
            cell(ours, "trials_to_reach_baseline", 0),
            cell(base, "trials_to_reach_baseline", 0),
            rcell("trials_to_reach_baseline", ratios[2]),
            cell(ours, "trials_to_reach_99pct_baseline", 0),
            cell(base, "trials_to_reach_99pct_baseline", 0),
            rcell("trials_to_reach_99pct_baseline", ratios[3]),
            cell(ours, "wall_s", 0),
            cell(base, "wall_s", 0),
        ));
    }
    let g: Vec<String> = logs.iter().map(|l| geo_mean_cell(l)).collect();
    out.push_str(&format!(
        "| geometric mean | | | | | {} | {} | | | {} | | | {} | | |\n",
        g[0], g[1], g[2], g[3]
    ));
    Ok(out)
}

/// `strategy`'s re-timed ratio to the baseline in a `retime.json` (as `compare-retime` writes
/// it); `None` when the file is absent or has no ratio for it.
fn retimed_ratio(path: &Path, strategy: &str) -> Result<Option<f64>, Error> {
    if !path.is_file() {
        return Ok(None);
    }
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path)?)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(v["strategies"][strategy]["retimed_ratio_to_baseline"].as_f64())
}

/// The geometric mean of ratios given as logarithms, with their count and, from three ratios
/// on, a 95% confidence interval (Student's t on the logarithms): whether a mean ratio of a few
/// percent over a handful of workloads says anything. `-` when there are none.
fn geo_mean_cell(logs: &[f64]) -> String {
    let n = logs.len();
    if n == 0 {
        return "-".to_string();
    }
    let mean = logs.iter().sum::<f64>() / n as f64;
    if n < 3 {
        return format!("{:.2} (of {n})", mean.exp());
    }
    let var = logs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let half = t_975(n - 1) * (var / n as f64).sqrt();
    format!(
        "{:.2} (of {n}; 95% CI {:.2}-{:.2})",
        mean.exp(),
        (mean - half).exp(),
        (mean + half).exp()
    )
}

/// The 97.5% quantile of Student's t with `df` degrees of freedom (the normal's past 30).
fn t_975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    T.get(df.max(1) - 1).copied().unwrap_or(1.96)
}

/// (strategy, seed) -> (trial, best latency so far) points, in trial order.
type Curves = BTreeMap<(String, u64), Vec<(usize, f64)>>;

/// Each (strategy, seed) curve of a `curves.csv` (as `compare` writes it): its (trial, best
/// latency so far) points in trial order.
fn read_curves(path: &Path) -> Result<Curves, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut curves = Curves::new();
    for (n, line) in text.lines().enumerate().skip(1) {
        let bad = || {
            format!(
                "{}:{}: not `strategy,seed,trial,best_latency_s,...`",
                path.display(),
                n + 1
            )
        };
        let mut f = line.split(',');
        let (Some(strategy), Some(seed), Some(trial), Some(latency)) =
            (f.next(), f.next(), f.next(), f.next())
        else {
            return Err(bad().into());
        };
        let (Ok(seed), Ok(trial), Ok(latency)) = (
            seed.parse::<u64>(),
            trial.parse::<usize>(),
            latency.parse::<f64>(),
        ) else {
            return Err(bad().into());
        };
        curves
            .entry((strategy.to_string(), seed))
            .or_default()
            .push((trial, latency));
    }
    Ok(curves)
}

/// The median over seeds of `strategy`'s best latency within the first `budget` trials; a
/// seed with no successful trial by then counts as infinitely slow. `None` when no seed of the
/// strategy is in `curves` or the median is infinite.
fn median_best_within(curves: &Curves, strategy: &str, budget: usize) -> Option<f64> {
    let best: Vec<f64> = curves
        .iter()
        .filter(|((s, _), _)| s == strategy)
        .map(|(_, c)| {
            c.iter()
                .take_while(|p| p.0 <= budget)
                .last()
                .map_or(f64::INFINITY, |p| p.1)
        })
        .collect();
    median(&best)
}

/// One markdown row per `DIR/*/compare.json` (with its `curves.csv`): at each trial budget,
/// `strategy`'s GFLOP/s over the baseline's, each the median over seeds of the best found
/// within that many trials; a last row of geometric means. It answers "which strategy should a
/// build with N trials use", which the final figures of a 1,000-trial run do not.
pub fn budget_table(dir: &Path, strategy: &str, budgets: &[usize]) -> Result<String, Error> {
    let files = compare_files(dir)?;
    if files.is_empty() {
        return Err(format!("no */compare.json under {}", dir.display()).into());
    }
    let heads: Vec<String> = budgets.iter().map(|b| format!("at {b} trials")).collect();
    let mut out = format!(
        "| workload ({strategy} / baseline GFLOP/s) | {} |\n|---|{}\n",
        heads.join(" | "),
        "---|".repeat(budgets.len())
    );
    let mut logs: Vec<Vec<f64>> = vec![Vec::new(); budgets.len()];
    for (path, v) in files {
        let base_name = v["baseline"].as_str().unwrap_or("ansor");
        let curves = read_curves(&path.with_file_name("curves.csv"))?;
        let trials = v["trials"].as_u64().map_or(usize::MAX, |t| t as usize);
        let mut cells = Vec::new();
        for (b, log) in budgets.iter().zip(logs.iter_mut()) {
            let ratio = (*b <= trials)
                .then(|| {
                    let ours = median_best_within(&curves, strategy, *b)?;
                    let base = median_best_within(&curves, base_name, *b)?;
                    Some(base / ours)
                })
                .flatten();
            if let Some(r) = ratio {
                log.push(r.ln());
            }
            cells.push(ratio.map_or("-".to_string(), |r| format!("{r:.2}")));
        }
        out.push_str(&format!(
            "| {} | {} |\n",
            v["workload"].as_str().unwrap_or("?"),
            cells.join(" | ")
        ));
    }
    let geo: Vec<String> = logs.iter().map(|l| geo_mean_cell(l)).collect();
    out.push_str(&format!("| geometric mean | {} |\n", geo.join(" | ")));
    Ok(out)
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

    #[test]
    fn compare_rows_give_ratios_against_the_baseline_and_their_geometric_mean() {
        let dir = std::env::temp_dir().join(format!("harl-cmp-summary-{}", std::process::id()));
        let run = |w: &str, ours: &str, base: &str| {
            let d = dir.join(w);
            std::fs::create_dir_all(&d).expect("dir");
            let text = format!(
                r#"{{"workload":"{w}","trials":1000,"seeds":[0,1,2],"baseline":"ansor",
                "strategies":{{"harl":{ours},"ansor":{base}}}}}"#
            );
            std::fs::write(d.join("compare.json"), text).expect("write");
        };
        run(
            "a",
            r#"{"final_gflops":110.0,"trials_to_reach_baseline":200,"trials_to_reach_99pct_baseline":100,"wall_s":50}"#,
            r#"{"final_gflops":100.0,"trials_to_reach_baseline":800,"trials_to_reach_99pct_baseline":400,"wall_s":60}"#,
        );
        run(
            "b",
            r#"{"final_gflops":90.0,"trials_to_reach_baseline":null,"trials_to_reach_99pct_baseline":800,"wall_s":50}"#,
            r#"{"final_gflops":100.0,"trials_to_reach_baseline":500,"trials_to_reach_99pct_baseline":200,"wall_s":60}"#,
        );
        std::fs::write(
            dir.join("a").join("retime.json"),
            r#"{"baseline":"ansor","strategies":{"harl":{"retimed_ratio_to_baseline":1.21},"ansor":{"retimed_ratio_to_baseline":1.0}}}"#,
        )
        .expect("write");
        let t = compare_table(&dir, "harl").expect("table");
        let missing = compare_table(&dir, "random");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            t.contains(
                "| a | 3 | 1000 | 110.0 | 100.0 | 1.10 | 1.21 | 200 | 800 | 0.25 | 100 | 400 | 0.25 |"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "| b | 3 | 1000 | 90.0 | 100.0 | 0.90 | - | never | 500 | never | 800 | 200 | 4.00 |"
            ),
            "{t}"
        );
        // sqrt(1.1 * 0.9) = 0.99; re-timed only where a retime.json is; the trials ratio only
        // where HARL got there; sqrt(0.25 * 4) = 1.
        assert!(
            t.contains(
                "| geometric mean | | | | | 0.99 (of 2) | 1.21 (of 1) | | | 0.25 (of 1) | | | 1.00 (of 2) |"
            ),
            "{t}"
        );
        assert!(missing.is_err());
    }

    #[test]
    fn geometric_means_get_a_t_interval_from_three_ratios() {
        assert_eq!(geo_mean_cell(&[]), "-");
        assert_eq!(geo_mean_cell(&[1.1f64.ln(), 0.9f64.ln()]), "0.99 (of 2)");
        // Ratios 1, 1.1, 1.21: mean log ln 1.1, standard deviation ln 1.1, half-width
        // 4.303 * ln 1.1 / sqrt 3 = 0.2368 -> exp(ln 1.1 -/+ 0.2368) = 0.87, 1.39.
        let logs = [1.0f64.ln(), 1.1f64.ln(), 1.21f64.ln()];
        assert_eq!(geo_mean_cell(&logs), "1.10 (of 3; 95% CI 0.87-1.39)");
        // Identical ratios: no spread, a zero-width interval.
        assert_eq!(
            geo_mean_cell(&[0.5f64.ln(); 4]),
            "0.50 (of 4; 95% CI 0.50-0.50)"
        );
        assert_eq!(t_975(1), 12.706);
        assert_eq!(t_975(100), 1.96);
    }

    #[test]
    fn budget_rows_take_the_median_best_within_each_budget() {
        let dir = std::env::temp_dir().join(format!("harl-budget-summary-{}", std::process::id()));
        let d = dir.join("w");
        std::fs::create_dir_all(&d).expect("dir");
        std::fs::write(
            d.join("compare.json"),
            r#"{"workload":"w","trials":4,"seeds":[0,1,2],"baseline":"ansor","strategies":{}}"#,
        )
        .expect("write");
        // harl's seeds reach 1.0 / 2.0 / 4.0 s by trial 2 and 0.5 / 1.0 / 4.0 by trial 4;
        // ansor's 2.0 / 2.0 / 8.0 and 2.0 / 1.0 / 8.0. Seed 2 of harl fails its first trial.
        let csv = "strategy,seed,trial,best_latency_s,elapsed_s\n\
            harl,0,1,2.0,0.1\nharl,0,2,1.0,0.2\nharl,0,4,0.5,0.4\n\
            harl,1,1,2.0,0.1\nharl,1,3,1.0,0.3\n\
            harl,2,2,4.0,0.2\n\
            ansor,0,1,2.0,0.1\n\
            ansor,1,1,2.0,0.1\nansor,1,4,1.0,0.4\n\
            ansor,2,1,8.0,0.1\n";
        std::fs::write(d.join("curves.csv"), csv).expect("write");
        let t = budget_table(&dir, "harl", &[1, 2, 4, 8]);
        std::fs::write(d.join("curves.csv"), "strategy,seed,trial\nharl,0,x\n").expect("write");
        let bad = budget_table(&dir, "harl", &[1]);
        let _ = std::fs::remove_dir_all(&dir);
        let t = t.expect("table");
        // Within 1 trial: harl's medians of (2, 2, inf) = 2, ansor's of (2, 2, 8) = 2 -> 1.00.
        // Within 2: (1, 2, 4) -> 2 against 2 -> 1.00. Within 4: (0.5, 1, 4) -> 1 against
        // (2, 1, 8) -> 2 -> 2.00. 8 is past the run's 4 trials.
        assert!(t.contains("| w | 1.00 | 1.00 | 2.00 | - |"), "{t}");
        assert!(
            t.contains("| geometric mean | 1.00 (of 1) | 1.00 (of 1) | 2.00 (of 1) | - |"),
            "{t}"
        );
        assert!(bad.is_err());
    }
}
