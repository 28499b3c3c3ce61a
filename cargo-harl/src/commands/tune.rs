//! `cargo harl tune`: tunes the kernels of a crate (found by building it, see [`super::krate`])
//! or of one build's manifest (`--manifest`, how a build script with `HARL_TUNE=on` calls the
//! tool), writes the winners to the crate's tuning cache and prints the tuning table.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use harl_build::directive::escape;
use harl_build::manifest::TuneOutcome;
use harl_tune::job::{self, JobOptions};

use super::krate;
use super::progress::{table, Live};

/// `cargo harl tune` arguments.
#[derive(Args, Debug)]
pub struct TuneArgs {
    /// Where the kernels are.
    #[command(flatten)]
    pub kernels: krate::KernelsArgs,
    /// Write records here instead of the crate's cache directory (e.g. one directory per
    /// shard, merged afterwards).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Also write what was done as JSON here (read by the build script that called the tool).
    #[arg(long, value_name = "FILE")]
    pub results: Option<PathBuf>,
    /// Measured trials per kernel, on average: the kernels of a crate share one budget of
    /// this many times their number.
    #[arg(long, env = "HARL_TRIALS", default_value_t = 64)]
    pub trials: usize,
    /// Wall-time budget per kernel, on average, in seconds (shared like --trials).
    #[arg(long = "time", env = "HARL_TUNE_SECONDS", default_value_t = 600)]
    pub seconds: u64,
    /// The whole crate's trial budget, shared by its kernels (instead of --trials each).
    #[arg(long, env = "HARL_TOTAL_TRIALS")]
    pub total_trials: Option<usize>,
    /// The whole crate's wall-time budget in seconds (instead of --time each).
    #[arg(long = "total-time", env = "HARL_TOTAL_SECONDS")]
    pub total_seconds: Option<u64>,
    /// Which kernel gets the next round: harl (HARL's sliding-window UCB bandit, weighing
    /// each kernel by how often the crate runs it), gradient (Ansor's) or round-robin.
    #[arg(long, env = "HARL_TASK_SCHEDULER", default_value = harl_tune::task_scheduler::DEFAULT_SCHEDULER)]
    pub scheduler: String,
    /// Search strategy: harl, ansor, autotvm or random.
    #[arg(long, env = "HARL_STRATEGY", default_value = "ansor")]
    pub strategy: String,
    /// Cost model: xgb-transfer (warm-started from harl's dataset), xgb (cold) or random.
    #[arg(long, env = "HARL_COST_MODEL", default_value = harl_tune::cost_model::DEFAULT_COST_MODEL)]
    pub cost_model: String,
    /// Seed of every search decision.
    #[arg(long, env = "HARL_SEED", default_value_t = 0)]
    pub seed: u64,
    /// Trials per GPU kernel (builds that generate GPU code, on a host with a GPU).
    #[arg(long, env = "HARL_GPU_TRIALS", default_value_t = 64)]
    pub gpu_trials: usize,
    /// Threads the kernels run with while measured (default: the build's, this machine's cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Tune share I of N of the kernels (0 <= I < N), e.g. one job of a CI matrix; merge the
    /// shards' caches with `cargo harl cache merge`.
    #[arg(long, value_name = "I/N", value_parser = parse_shard)]
    pub shard: Option<(usize, usize)>,
    /// Tune kernels that already have a record for this CPU too.
    #[arg(long)]
    pub force: bool,
    /// Time candidates with the caches evicted before each timed run (weights and inputs
    /// from memory) instead of warm; in a build, `HARL_TUNE_COLD=1`.
    #[arg(long, env = "HARL_TUNE_COLD", value_parser = clap::builder::BoolishValueParser::new())]
    pub cold: bool,
}

fn parse_shard(s: &str) -> Result<(usize, usize), String> {
    let (i, n) = s
        .split_once('/')
        .ok_or_else(|| format!("`{s}` is not I/N"))?;
    let i: usize = i
        .trim()
        .parse()
        .map_err(|_| format!("`{s}`: I is not a number"))?;
    let n: usize = n
        .trim()
        .parse()
        .map_err(|_| format!("`{s}`: N is not a number"))?;
    if n == 0 || i >= n {
        return Err(format!("`{s}`: need 0 <= I < N"));
    }
    Ok((i, n))
}

/// Why a tune could not run.
#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    /// The crate's kernels (its manifests) could not be found or read.
    #[error(transparent)]
    Crate(#[from] krate::CrateError),
    /// The job could not start.
    #[error(transparent)]
    Job(#[from] job::JobError),
    /// The results file could not be written.
    #[error("{}: {source}", path.display())]
    Results {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Runs the command.
pub fn run(args: TuneArgs) -> Result<ExitCode, TuneError> {
    let mut manifests = args.kernels.load()?;
    if let Some(dir) = &args.cache_dir {
        for (_, m) in &mut manifests {
            m.cache_dir = dir.clone();
        }
    }
    let options = JobOptions {
        trials: args.trials,
        seconds: Some(args.seconds),
        total_trials: args.total_trials,
        total_seconds: args.total_seconds,
        scheduler: args.scheduler.clone(),
        seed: args.seed,
        strategy: args.strategy.clone(),
        cost_model: args.cost_model.clone(),
        threads: args.threads,
        shard: args.shard,
        force: args.force,
        log_dir: None,
        gpu_trials: args.gpu_trials,
        cold: args.cold,
    };
    let mut outcomes: Vec<TuneOutcome> = Vec::new();
    let mut live = Live::new(manifests.len());
    for (_, manifest) in &manifests {
        let todo = job::select(manifest, &options)?;
        let cached = manifest.kernels.len() - todo.len();
        eprintln!(
            "{}: {} kernel(s), {} to tune on {} ({} threads, {} trials shared by task scheduler {}, strategy {}, cost model {}, seed {}{}); cache {}",
            escape(&manifest.package),
            manifest.kernels.len(),
            todo.len(),
            escape(&manifest.target.isa_class),
            job::threads(manifest, &options),
            options.job_trials(todo.len()),
            escape(&options.scheduler),
            escape(&options.strategy),
            escape(&options.cost_model),
            options.seed,
            args.shard
                .map_or(String::new(), |(i, n)| format!(", shard {i}/{n}")),
            escape(&manifest.cache_dir.display().to_string()),
        );
        if todo.is_empty() && !manifest.cuda {
            eprintln!(
                "  nothing to tune: {cached} kernel(s) have records for this CPU or are another shard's (--force tunes again)"
            );
            continue;
        }
        outcomes.extend(job::run(manifest, &todo, &options, &mut live)?);
    }
    if let Some(path) = &args.results {
        let text = serde_json::to_string(&outcomes).unwrap_or_else(|_| "[]".into());
        std::fs::write(path, text).map_err(|source| TuneError::Results {
            path: path.clone(),
            source,
        })?;
    }
    if !outcomes.is_empty() {
        println!("\n{}", table(&outcomes));
        let cache: Vec<String> = outcomes
            .iter()
            .filter_map(|o| o.recorded_in.as_ref())
            .map(|p| escape(&p.display().to_string()))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if !cache.is_empty() {
            println!(
                "records written to {} (commit them so your users get these kernels without tuning)",
                cache.join(", ")
            );
        }
    }
    // A GPU kernel on a host without a GPU is a note, not a failure.
    let failed = outcomes
        .iter()
        .any(|o| o.latency_s.is_none() && !o.name.ends_with("(gpu)"));
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::{parse_shard, TuneArgs};
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: TuneArgs,
    }

    /// The build hands the knob over as `HARL_TUNE_COLD=1`, the command line as `--cold`.
    #[test]
    fn cold_timing_is_off_unless_asked() {
        assert!(!Cli::try_parse_from(["t"]).expect("parse").args.cold);
        assert!(
            Cli::try_parse_from(["t", "--cold"])
                .expect("parse")
                .args
                .cold
        );
        std::env::set_var("HARL_TUNE_COLD", "1");
        let from_env = Cli::try_parse_from(["t"]).map(|c| c.args.cold);
        std::env::remove_var("HARL_TUNE_COLD");
        assert!(from_env.expect("parse"));
    }

    #[test]
    fn shards_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_shard("0/2"), Ok((0, 2)));
        assert_eq!(parse_shard(" 3 / 4 "), Ok((3, 4)));
        for bad in ["2/2", "1/0", "x/2", "1", "-1/2"] {
            assert!(parse_shard(bad).is_err(), "{bad}");
        }
    }
}
