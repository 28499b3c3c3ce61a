//! `cargo harl cache retime`: every record in a crate's tuning cache that its build could pick
//! on this CPU, timed beside the schedule the build would use without it (this harl's
//! default), in one worker a round (see `harl_tune::retime`); with `--drop`, the records slower
//! than the default by more than the margin, and those that no longer run correctly, are
//! removed from the file. Records made by an older harl, or on another CPU of the same ISA
//! class, can lose to today's defaults: this is how a crate checks what it ships.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use harl_build::cache::{read_file, write_records, Record, TuningCache};
use harl_build::directive::escape;
use harl_build::manifest::Manifest;
use harl_tune::job::{self, JobOptions};
use harl_tune::retime::{candidates, retime, RecordTiming, Verdict};

use super::krate;

/// `cargo harl cache retime` arguments.
#[derive(Args, Debug)]
pub struct RetimeArgs {
    /// Where the kernels are.
    #[command(flatten)]
    pub kernels: krate::KernelsArgs,
    /// Rounds: each round times the default and the workload's records once, in one worker
    /// batch, in a rotating order; the figures are medians over the rounds.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub rounds: u64,
    /// Passes: all the rounds again, this many times, one after the other; a record is dropped
    /// only when every pass finds it slower (or failed). On a shared machine a record can lose
    /// every round of one pass and win rounds of the next.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=10))]
    pub passes: u64,
    /// A record is slower (or faster) than the default when its median differs by more than
    /// this fraction (0.05: 5%) and it lost (won) every round.
    #[arg(long, default_value_t = 0.05, value_parser = parse_margin)]
    pub margin: f64,
    /// Remove the records slower than the default, and those whose runs all failed, in every
    /// pass, from the cache file (rewritten like `prune`: unusable lines go too, each reported).
    #[arg(long)]
    pub drop: bool,
    /// Threads the kernels run with (default: the build's).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Time with the caches evicted before each timed run (weights and inputs from memory).
    #[arg(long)]
    pub cold: bool,
}

fn parse_margin(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(m) if (0.0..1.0).contains(&m) => Ok(m),
        _ => Err(format!("`{s}`: a fraction in [0, 1), such as 0.05")),
    }
}

/// Why a retime could not run.
#[derive(Debug, thiserror::Error)]
pub enum RetimeError {
    /// The crate's kernels (its manifests) could not be found or read, or cannot be measured.
    #[error(transparent)]
    Kernels(#[from] super::tune::TuneError),
    /// This machine cannot measure the crate's kernels.
    #[error("{package}: {why}")]
    Measure {
        /// The package.
        package: String,
        /// Why.
        why: String,
    },
    /// The cache file could not be read or rewritten.
    #[error("{}: {why}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
}

/// Runs the command.
pub fn run(args: RetimeArgs) -> Result<ExitCode, RetimeError> {
    let manifests = args.kernels.load().map_err(super::tune::TuneError::from)?;
    let rounds = usize::try_from(args.rounds).unwrap_or(1);
    let mut timed = 0usize;
    for (_, manifest) in &manifests {
        timed += retime_one(manifest, &args, rounds)?;
    }
    if timed == 0 {
        println!("no records to time: the cache has none for this CPU's kernels");
    }
    Ok(ExitCode::SUCCESS)
}

/// Retimes one package's records; the number timed.
fn retime_one(manifest: &Manifest, args: &RetimeArgs, rounds: usize) -> Result<usize, RetimeError> {
    let file = TuningCache::new(&manifest.cache_dir).path_for(&manifest.target.isa_class);
    let (work, warnings) = candidates(manifest);
    for w in warnings {
        eprintln!("{}", escape(&format!("skipped: {w}")));
    }
    let count: usize = work.iter().map(|w| w.records.len()).sum();
    let options = JobOptions {
        threads: args.threads,
        cold: args.cold,
        ..JobOptions::default()
    };
    let threads = job::threads(manifest, &options);
    eprintln!(
        "{}",
        escape(&format!(
            "{}: {count} record(s) of {} workload(s) in {} to time beside the default on {} ({threads} threads, {rounds} rounds, {} pass(es))",
            manifest.package,
            work.len(),
            file.display(),
            manifest.target.isa_class,
            args.passes,
        ))
    );
    if work.is_empty() {
        return Ok(0);
    }
    let (mut measurer, variant) = job::measurer(manifest, threads, &options)
        .map_err(super::tune::TuneError::from)?
        .map_err(|why| RetimeError::Measure {
            package: manifest.package.clone(),
            why,
        })?;
    let cpu = variant.cpu_target(&manifest.target.arch, threads);
    let passes = usize::try_from(args.passes).unwrap_or(1);
    let mut timed: Vec<Vec<RecordTiming>> = Vec::new();
    for pass in 1..=passes {
        let timings = retime(manifest, &work, &cpu, &mut measurer, rounds);
        if passes > 1 {
            println!("pass {pass} of {passes}:");
        }
        println!("{}", table(&timings, args.margin));
        timed.push(timings);
    }
    // A record loses when every pass says so (each pass times the same records in order).
    let loses =
        |t: &RecordTiming| matches!(t.verdict(args.margin), Verdict::Slower | Verdict::Failed);
    let losers: Vec<&Record> = (0..count)
        .filter(|&i| timed.iter().all(|p| p.get(i).is_some_and(loses)))
        .filter_map(|i| timed.first()?.get(i).map(|t| &t.record))
        .collect();
    if args.drop && !losers.is_empty() {
        drop_records(&file, &losers)?;
    } else if !losers.is_empty() {
        println!(
            "{} record(s) lose to the default: --drop removes them",
            losers.len()
        );
    }
    Ok(count)
}

/// The markdown table of the timings.
fn table(timings: &[RecordTiming], margin: f64) -> String {
    let us = |s: Option<f64>| s.map_or("-".into(), |s| format!("{:.1}", s * 1e6));
    let mut out = String::from(
        "| kernel | record made on | recorded us | default us | record us | default / record | rounds won | verdict |\n|---|---|---|---|---|---|---|---|\n",
    );
    for t in timings {
        let made_on = if t.exact {
            "this CPU".to_string()
        } else {
            format!("{} (same ISA class)", t.record.target.cpu_model)
        };
        let verdict = match t.verdict(margin) {
            Verdict::Faster => "faster: kept".to_string(),
            Verdict::Even => "even: kept".to_string(),
            Verdict::Slower => "slower".to_string(),
            Verdict::Unjudged => "default failed: kept".to_string(),
            Verdict::Failed => format!(
                "failed: {}",
                t.error
                    .as_deref()
                    .unwrap_or("no run")
                    .lines()
                    .next()
                    .unwrap_or("")
            ),
        };
        let line = format!(
            "| {} | {made_on} | {} | {} | {} | {} | {}/{} | {verdict} |",
            t.kernel,
            us(Some(t.record.latency_s)),
            us(t.default_s),
            us(t.record_s),
            t.speedup().map_or("-".into(), |x| format!("{x:.2}x")),
            t.rounds_won,
            t.rounds_paired,
        );
        out.push_str(&escape(&line));
        out.push('\n');
    }
    out
}

/// Rewrites `file` without `losers` (every line equal to one of them) and without the lines
/// that do not parse as records, each reported.
fn drop_records(file: &std::path::Path, losers: &[&Record]) -> Result<(), RetimeError> {
    let bad = |why: String| RetimeError::File {
        path: file.to_path_buf(),
        why,
    };
    let lines = read_file(file)
        .map_err(bad)?
        .ok_or_else(|| bad("the file is gone".into()))?;
    let (mut kept, mut dropped) = (Vec::new(), 0usize);
    for (line, parsed) in lines {
        match parsed {
            Ok(r) if losers.contains(&&r) => dropped += 1,
            Ok(r) => kept.push(r),
            Err(e) => println!(
                "{}",
                escape(&format!("{}:{line}: dropped: {e}", file.display()))
            ),
        }
    }
    write_records(file, &kept).map_err(|e| bad(e.to_string()))?;
    println!(
        "{}",
        escape(&format!(
            "{}: dropped {dropped} line(s) of {} record(s) that lose to the default; {} kept",
            file.display(),
            losers.len(),
            kept.len()
        ))
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_margin;

    #[test]
    fn margins_are_fractions() {
        assert_eq!(parse_margin("0.05"), Ok(0.05));
        assert_eq!(parse_margin("0"), Ok(0.0));
        for bad in ["1", "-0.1", "5%", "nan", "inf"] {
            assert!(parse_margin(bad).is_err(), "{bad}");
        }
    }
}
