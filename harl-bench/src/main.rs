//! `harl-bench`: harl's generated kernels against peer libraries, in one run.
//!
//! ```text
//! harl-bench [spine] [--json PATH]   harl vs the gemm crate and matrixmultiply (the default)
//! harl-bench record [--out DIR]      measure the quickstart's kernels, append tuning records
//! harl-bench help                    every command (clap)
//! ```
//!
//! Commands are modules over a shared [`harness`]; none imports another. The timed kernels
//! are in [`kernels`].

mod compare;
mod dataset;
mod e2e;
mod fidelity;
mod gpu;
mod harness;
mod kernels;
mod math;
mod metatune;
mod model_eval;
mod models;
mod peers;
mod probe;
mod record;
mod remeasure;
mod report;
mod retime;
mod spine;
mod stats;
mod suite;
mod summarize;
mod timing;
mod transfer_eval;
mod tune;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// Any error of a subcommand; printed by `main`, which then exits non-zero.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// harl's benchmarks: kernels against peer libraries, tuning runs and their comparisons.
#[derive(Parser, Debug)]
#[command(name = "harl-bench", args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// With no command: `spine`'s options.
    #[command(flatten)]
    spine: spine::Options,
}

/// A command.
#[derive(Subcommand, Debug)]
enum Command {
    /// harl's kernels vs the gemm crate and matrixmultiply, 1 thread and all cores (the
    /// default command).
    Spine(spine::Options),
    /// Measure the quickstart's kernels as built here and append a tuning record per kernel.
    Record(record::Options),
    /// Tune one workload (suite name or spec, see `list`); writes DIR/summary.json and
    /// DIR/curve.csv.
    Tune(tune::Options),
    /// Strategies on the same workload and seeds (compare.json, curves.csv, curves.svg, then
    /// the winners timed again: retime.json); or task schedulers on one BERT-base encoder
    /// layer with `--network bert` (network.json).
    Compare(compare::Options),
    /// The cost model's ranking quality on held-out records.json rows vs random.
    ModelEval {
        /// records.json files.
        #[arg(required = true)]
        files: Vec<String>,
    },
    /// Tune a GPU schedule on device 0, verify it, compare with cuBLAS on GEMMs.
    Gpu(gpu::Options),
    /// One markdown table from DIR/*/summary.json (see scripts/suite.sh).
    Summarize {
        /// The suite's output directory.
        dir: PathBuf,
    },
    /// One markdown table from DIR/*/compare.json: a strategy against the baseline, medians
    /// over seeds, geometric means, the re-timed ratio where a retime.json is.
    CompareSummary(CompareSummary),
    /// Time the best schedule of every saved run of one compare directory again, all in one
    /// batch per round with the default schedule; DIR/retime.json.
    CompareRetime {
        /// The compare directory.
        dir: PathBuf,
        /// Rounds (medians).
        #[arg(long, default_value_t = 5, value_parser = harness::positive)]
        rounds: usize,
    },
    /// Time the tuned schedules under DIR, the default schedule and the gemm crate again,
    /// interleaved in one run; DIR/remeasure.json.
    Remeasure {
        /// The suite's output directory.
        dir: PathBuf,
        /// Threads.
        #[arg(long, default_value_t = 1, value_parser = harness::positive)]
        threads: usize,
        /// Rounds (medians).
        #[arg(long, default_value_t = 3, value_parser = harness::positive)]
        rounds: usize,
    },
    /// Time the default schedule twice and each sketch's seed in one batch, rotating their
    /// order (a check of the measurer); with `--against`, schedules saved by another build of
    /// harl-bench too (an A/B of two default heuristics in one sitting).
    Probe {
        /// Suite name or spec, or a `models` kernel's name (weights prepared).
        #[arg(long)]
        workload: String,
        /// Threads.
        #[arg(long, default_value_t = 1, value_parser = harness::positive)]
        threads: usize,
        /// Rounds.
        #[arg(long, default_value_t = 5, value_parser = harness::positive)]
        rounds: usize,
        /// Write the timed candidates' code here.
        #[arg(long)]
        emit: Option<PathBuf>,
        /// Write this build's default schedule of the workload to this file (JSON) and stop.
        #[arg(long)]
        save_default: Option<PathBuf>,
        /// Also time the schedule in this file (JSON, from `--save-default`), named by the file.
        #[arg(long)]
        against: Vec<PathBuf>,
        /// Write 64 MB of another buffer before each timed run: weights and inputs come from
        /// memory, as in a network, instead of the caches the last run left warm.
        #[arg(long)]
        cold: bool,
    },
    /// harl's vector math (exp, log, tanh, erf, GELU) in emitted kernels against the scalar
    /// libm loop harl emitted before, one thread, interleaved rounds.
    Math {
        /// Rounds (medians).
        #[arg(long, default_value_t = 5, value_parser = harness::positive)]
        rounds: usize,
    },
    /// The kernels of BERT-base, ResNet-50, MobileNet-V2 and LLM decode GEMVs against
    /// onnxruntime and numpy's BLAS (scripts/peers.py), default schedule and after --trials.
    Models(models::Options),
    /// The latency the measurer records for a schedule against what a user's release binary,
    /// built from that record, measures for it (same threads, inputs alike).
    Fidelity(fidelity::Options),
    /// A whole ONNX network built by harl as a user's crate builds it, against onnxruntime on
    /// the same file (scripts/make_networks.py makes ResNet-50, MobileNet-V2, BERT-base).
    E2e(e2e::Options),
    /// Tune a published set of workloads and store every measured trial: the cost models'
    /// warm-start dataset (`--split train`, shipped in harl-tune) or held-out records
    /// (`--split eval`).
    Dataset(dataset::Options),
    /// Cost models' ranking of held-out workloads after 0, 16, 64 of their own trials.
    TransferEval(transfer_eval::Options),
    /// Meta-train MetaTune's weights (first-order MAML) on a shipped dataset.
    Metatune(metatune::Options),
    /// The tuning suite's workloads and the workload spec keys.
    List,
    /// The hidden matrixmultiply timing worker (see [`spine::WORKER_COMMAND`]).
    #[command(name = "__matrixmultiply", hide = true)]
    MatrixMultiplyWorker {
        /// The workload.
        workload: String,
        /// Threads.
        threads: usize,
    },
}

/// `compare-summary DIR [--strategy S] [--budgets B1,B2,...]`.
#[derive(Args, Debug)]
struct CompareSummary {
    /// The compare suite's output directory.
    dir: PathBuf,
    /// The strategy set against the baseline.
    #[arg(long, default_value = "harl")]
    strategy: String,
    /// Also a table of the strategy's GFLOP/s over the baseline's within each budget.
    #[arg(long, value_delimiter = ',', value_parser = harness::positive)]
    budgets: Vec<usize>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command.unwrap_or(Command::Spine(cli.spine))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("harl-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a parsed command.
fn run(command: Command) -> Result<(), Error> {
    match command {
        Command::Spine(options) => spine::run(&options),
        Command::MatrixMultiplyWorker { workload, threads } => {
            spine::matrixmultiply_worker(&workload, threads)
        }
        Command::Record(options) => record::run(&options),
        Command::Tune(options) => tune::run(&options),
        Command::ModelEval { files } => model_eval::run(&files),
        Command::Compare(options) => compare::run(&options),
        Command::Probe {
            workload,
            threads,
            rounds,
            emit,
            save_default,
            against,
            cold,
        } => probe::run(&probe::Probe {
            workload: &workload,
            threads,
            rounds,
            emit: emit.as_deref(),
            save_default: save_default.as_deref(),
            against: &against,
            cold,
        }),
        Command::Summarize { dir } => summarize::run(&dir),
        Command::CompareSummary(c) => {
            print!("{}", summarize::compare_table(&c.dir, &c.strategy)?);
            if !c.budgets.is_empty() {
                print!(
                    "\n{}",
                    summarize::budget_table(&c.dir, &c.strategy, &c.budgets)?
                );
            }
            Ok(())
        }
        Command::CompareRetime { dir, rounds } => retime::run(&dir, rounds),
        Command::Remeasure {
            dir,
            threads,
            rounds,
        } => remeasure::run(&dir, threads, rounds),
        Command::Gpu(options) => gpu::run(&options),
        Command::Math { rounds } => math::run(rounds),
        Command::Models(options) => models::run(&options),
        Command::Fidelity(options) => fidelity::run(&options),
        Command::E2e(options) => e2e::run(&options),
        Command::Dataset(options) => dataset::run(&options),
        Command::TransferEval(options) => transfer_eval::run(&options),
        Command::Metatune(options) => metatune::run(&options),
        Command::List => {
            print!("{}", suite::list());
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        let cli = Cli::try_parse_from(std::iter::once("harl-bench").chain(args.iter().copied()))?;
        Ok(cli.command.unwrap_or(Command::Spine(cli.spine)))
    }

    #[test]
    fn no_arguments_mean_spine() {
        assert!(matches!(parse(&[]), Ok(Command::Spine(o)) if o.json.is_none()));
    }

    #[test]
    fn json_path_in_both_forms() {
        for a in [
            &["spine", "--json", "t.json"][..],
            &["--json=t.json"][..],
            &["--json", "t.json"][..],
        ] {
            match parse(a) {
                Ok(Command::Spine(o)) => assert_eq!(o.json.as_deref(), Some("t.json".as_ref())),
                other => panic!("{a:?} parsed as {other:?}"),
            }
        }
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(parse(&["tun"]).is_err());
        assert!(parse(&["spine", "--json"]).is_err());
        assert!(parse(&["spine", "--fast"]).is_err());
        assert!(parse(&["tune"]).is_err(), "--workload is required");
        assert!(parse(&["tune", "--workload", "gemm_128", "--trials", "0"]).is_err());
        assert!(
            parse(&["compare", "--trials", "8"]).is_err(),
            "a workload or a network"
        );
        assert!(parse(&["compare", "--workload", "w", "--network", "bert"]).is_err());
        assert!(parse(&["gpu", "--workload", "w", "--strategy", "x"]).is_err());
    }

    #[test]
    fn options_keep_their_names_and_defaults() {
        match parse(&["tune", "--workload", "gemm_128", "--no-default-seed"]) {
            Ok(Command::Tune(o)) => {
                assert_eq!(
                    (o.strategy.as_str(), o.trials, o.threads, o.batch),
                    ("ansor", 200, 1, 16)
                );
                assert!(!o.seed_default);
            }
            other => panic!("parsed as {other:?}"),
        }
        match parse(&[
            "compare",
            "--workload",
            "w",
            "--seeds",
            "0,1",
            "--retime",
            "0",
        ]) {
            Ok(Command::Compare(o)) => {
                assert_eq!(o.seeds, vec![0, 1]);
                assert_eq!(o.strategies, vec!["harl", "ansor", "random"]);
                assert_eq!(o.retime_rounds, 0);
                assert!(o.seed_default);
            }
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn compare_summary_takes_a_strategy_and_budgets_in_any_order() {
        match parse(&[
            "compare-summary",
            "d",
            "--budgets",
            "64,128",
            "--strategy",
            "x",
        ]) {
            Ok(Command::CompareSummary(c)) => {
                assert_eq!(c.dir, std::path::PathBuf::from("d"));
                assert_eq!(c.strategy, "x");
                assert_eq!(c.budgets, vec![64, 128]);
            }
            other => panic!("parsed as {other:?}"),
        }
        match parse(&["compare-summary", "d"]) {
            Ok(Command::CompareSummary(c)) => assert!(c.strategy == "harl" && c.budgets.is_empty()),
            other => panic!("parsed as {other:?}"),
        }
        assert!(parse(&["compare-summary", "d", "--budgets", "64,0"]).is_err());
        assert!(parse(&["compare-summary", "d", "--budgets"]).is_err());
        assert!(parse(&["compare-summary"]).is_err());
        assert!(matches!(
            parse(&["compare-retime", "d", "--rounds", "3"]),
            Ok(Command::CompareRetime { rounds: 3, .. })
        ));
        assert!(parse(&["compare-retime", "d", "--rounds", "0"]).is_err());
        assert!(matches!(
            parse(&["__matrixmultiply", "matmul_512", "2"]),
            Ok(Command::MatrixMultiplyWorker { threads: 2, .. })
        ));
    }
}
