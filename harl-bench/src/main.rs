//! `harl-bench`: harl's generated kernels against peer libraries, in one run.
//!
//! ```text
//! harl-bench [spine] [--json PATH]   harl vs the gemm crate and matrixmultiply (the default)
//! harl-bench record [--out DIR]      measure the quickstart's kernels, append tuning records
//! harl-bench help                    this text
//! ```
//!
//! The kernels are registered in `build.rs` and built from the workspace's `tuning-cache/`
//! (default schedules where it has no record).

mod compare;
mod gpu;
mod model_eval;
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
mod tune;
mod workload;

use std::process::ExitCode;

harl::include_kernels!();

/// Any error of a subcommand; printed by `main`, which then exits non-zero.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

const USAGE: &str = "\
usage: harl-bench [spine] [--json PATH]
  spine        harl's kernels vs the gemm crate and matrixmultiply, 1 thread and all cores
               (the default command)
  --json PATH  also write the result table as JSON to PATH
  record [--out DIR]
               measure the quickstart's kernels as built here and append a tuning record
               per kernel to DIR (default examples/quickstart/tuning-cache)
  tune --workload W --strategy S --trials N --seed K --threads T --out DIR [--batch B]
               tune one workload (suite name or spec, see `list`) with random | ansor |
               autotvm; writes DIR/summary.json and DIR/curve.csv
  compare --workload W --strategies harl,ansor,random --trials N --seeds 0,1,2 --out DIR
          [--retime R]
               strategies on the same workload and seeds; compare.json, curves.csv, curves.svg;
               then the winners timed again side by side, R rounds (default 5, 0: none),
               as compare-retime does; retime.json
  compare --network bert --schedulers harl,gradient --trials N --seeds 0 --out DIR
               task allocation on one BERT-base encoder layer; network.json
  model-eval FILES...
               the cost model's ranking quality on held-out records.json rows vs random
  gpu --workload W --trials N --seed K --out DIR [--batch B] [--record CACHE_DIR]
               tune a GPU schedule on device 0 (cost-model-guided sampling of the GPU
               sketch), verify it, compare with cuBLAS on GEMMs; summary.json, curve.csv
  summarize DIR
               one markdown table from DIR/*/summary.json (see scripts/suite.sh)
  compare-summary DIR [--strategy S] [--budgets 64,128,...]
               one markdown table from DIR/*/compare.json: S (default harl) against the
               baseline, medians over seeds, geometric means, the re-timed ratio where a
               retime.json is (see scripts/compare-suite.sh);
               --budgets adds a table of S's GFLOP/s over the baseline's within each budget
  compare-retime DIR [--rounds R]
               time the best schedule of every saved run of one compare directory again,
               all in one batch per round with the default schedule (medians of R, default
               5); the strategies' ratio on like-for-like timings; DIR/retime.json
  remeasure DIR [--threads T] [--rounds R]
               time the tuned schedules under DIR, the default schedule and the gemm crate
               again, interleaved in one run (R rounds, medians); DIR/remeasure.json
  probe --workload W [--threads T] [--rounds R] [--emit DIR]
               time the default schedule twice and each sketch's seed in one batch,
               rotating their order (a check of the measurer); --emit writes their code
  list         the tuning suite's workloads and the workload spec keys
  help         print this text";

/// A parsed command line.
#[derive(Debug)]
enum Command {
    /// `spine [--json PATH]`.
    Spine(spine::Options),
    /// The hidden matrixmultiply timing worker (see [`spine::WORKER_COMMAND`]).
    MatrixMultiplyWorker { workload: String, threads: usize },
    /// `tune --workload W --strategy S --trials N --seed K --threads T --out DIR`.
    Tune(tune::Options),
    /// `compare ...`.
    Compare(compare::Options),
    /// `model-eval FILES...`.
    ModelEval(Vec<String>),
    /// `list` (or `--list`): the tuning suite and the spec keys.
    List,
    /// `gpu ...`.
    Gpu(gpu::Options),
    /// `remeasure DIR [--threads T] [--rounds R]`.
    Remeasure(std::path::PathBuf, usize, usize),
    /// `probe --workload W [--threads T] [--rounds R] [--emit DIR]`.
    Probe(String, usize, usize, Option<std::path::PathBuf>),
    /// `summarize DIR`.
    Summarize(std::path::PathBuf),
    /// `compare-summary DIR [--strategy S] [--budgets B1,B2,...]`.
    CompareSummary(std::path::PathBuf, String, Vec<usize>),
    /// `compare-retime DIR [--rounds R]`.
    CompareRetime(std::path::PathBuf, usize),
    /// `record [--out DIR]`.
    Record(record::Options),
    /// `help`, `-h`, `--help`.
    Help,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match parse(&args).and_then(run) {
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
        Command::ModelEval(files) => model_eval::run(&files),
        Command::Compare(options) => compare::run(&options),
        Command::Probe(w, threads, rounds, emit) => {
            probe::run(&w, threads, rounds, emit.as_deref())
        }
        Command::Summarize(dir) => summarize::run(&dir),
        Command::CompareSummary(dir, strategy, budgets) => {
            print!("{}", summarize::compare_table(&dir, &strategy)?);
            if !budgets.is_empty() {
                print!("\n{}", summarize::budget_table(&dir, &strategy, &budgets)?);
            }
            Ok(())
        }
        Command::CompareRetime(dir, rounds) => retime::run(&dir, rounds),
        Command::Remeasure(dir, threads, rounds) => remeasure::run(&dir, threads, rounds),
        Command::Gpu(options) => gpu::run(&options),
        Command::List => {
            print!("{}", suite::list());
            Ok(())
        }
        Command::Help => {
            println!("{USAGE}");
            Ok(())
        }
    }
}

/// `compare-summary DIR [--strategy S] [--budgets B1,B2,...]`, flags in any order.
fn parse_compare_summary(args: &[String]) -> Result<Command, Error> {
    let usage =
        || format!("compare-summary: expected DIR [--strategy S] [--budgets 64,128,...]\n{USAGE}");
    let Some((dir, mut rest)) = args.split_first() else {
        return Err(usage().into());
    };
    let mut strategy = "harl".to_string();
    let mut budgets = Vec::new();
    while let [flag, value, tail @ ..] = rest {
        match flag.as_str() {
            "--strategy" => strategy = value.clone(),
            "--budgets" => {
                budgets = value
                    .split(',')
                    .map(|b| match b.trim().parse::<usize>() {
                        Ok(n) if n > 0 => Ok(n),
                        _ => Err(format!(
                            "compare-summary: --budgets: `{b}` is not a trial count"
                        )),
                    })
                    .collect::<Result<_, _>>()?;
            }
            _ => return Err(usage().into()),
        }
        rest = tail;
    }
    if !rest.is_empty() {
        return Err(usage().into());
    }
    Ok(Command::CompareSummary(dir.into(), strategy, budgets))
}

/// Parses the arguments after the program name; options alone mean `spine`.
fn parse(args: &[String]) -> Result<Command, Error> {
    let Some(first) = args.first() else {
        return Ok(Command::Spine(spine::Options::default()));
    };
    match first.as_str() {
        "spine" => parse_spine(&args[1..]).map(Command::Spine),
        "help" | "-h" | "--help" => Ok(Command::Help),
        "list" | "--list" => Ok(Command::List),
        "gpu" => gpu::parse(&args[1..]).map(Command::Gpu),
        "remeasure" => parse_remeasure(&args[1..]),
        "probe" => parse_probe(&args[1..]),
        "summarize" => match &args[1..] {
            [dir] => Ok(Command::Summarize(dir.into())),
            _ => Err(format!("summarize: expected one DIR\n{USAGE}").into()),
        },
        "compare-summary" => parse_compare_summary(&args[1..]),
        "compare-retime" => match &args[1..] {
            [dir] => Ok(Command::CompareRetime(dir.into(), 5)),
            [dir, flag, r] if flag == "--rounds" => match r.parse::<usize>() {
                Ok(n) if n > 0 => Ok(Command::CompareRetime(dir.into(), n)),
                _ => Err(format!("compare-retime: --rounds: `{r}` is not a positive count").into()),
            },
            _ => Err(format!("compare-retime: expected DIR [--rounds R]\n{USAGE}").into()),
        },
        "model-eval" => Ok(Command::ModelEval(args[1..].to_vec())),
        "compare" => compare::parse(&args[1..]).map(Command::Compare),
        "tune" if args[1..].iter().any(|a| a == "--list") => Ok(Command::List),
        "tune" => tune::parse(&args[1..]).map(Command::Tune),
        "record" => match &args[1..] {
            [] => Ok(Command::Record(record::Options::default())),
            [flag, dir] if flag == "--out" => {
                Ok(Command::Record(record::Options { out: dir.into() }))
            }
            _ => Err(format!("record: expected `--out DIR`\n{USAGE}").into()),
        },
        spine::WORKER_COMMAND => match &args[1..] {
            [workload, threads] => Ok(Command::MatrixMultiplyWorker {
                workload: workload.clone(),
                threads: threads.parse()?,
            }),
            _ => Err(format!(
                "usage: harl-bench {} WORKLOAD THREADS",
                spine::WORKER_COMMAND
            )
            .into()),
        },
        option if option.starts_with('-') => parse_spine(args).map(Command::Spine),
        other => Err(format!("unknown command `{other}`\n{USAGE}").into()),
    }
}

/// Parses `probe --workload W [--threads T] [--rounds R] [--emit DIR]`.
fn parse_probe(args: &[String]) -> Result<Command, Error> {
    let (mut workload, mut threads, mut rounds, mut emit) = (None, 1, 5, None);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--workload" => workload = Some(value.clone()),
            "--threads" => threads = value.parse()?,
            "--rounds" => rounds = value.parse()?,
            "--emit" => emit = Some(value.into()),
            other => return Err(format!("probe: unknown option `{other}`\n{USAGE}").into()),
        }
    }
    let workload = workload.ok_or_else(|| format!("probe: --workload is required\n{USAGE}"))?;
    Ok(Command::Probe(workload, threads, rounds, emit))
}

/// Parses `remeasure DIR [--threads T] [--rounds R]`.
fn parse_remeasure(args: &[String]) -> Result<Command, Error> {
    let (dir, rest) = args
        .split_first()
        .ok_or_else(|| format!("remeasure: expected DIR\n{USAGE}"))?;
    let (mut threads, mut rounds) = (1, 3);
    let mut it = rest.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--threads" => threads = value.parse()?,
            "--rounds" => rounds = value.parse()?,
            other => return Err(format!("remeasure: unknown argument `{other}`").into()),
        }
    }
    Ok(Command::Remeasure(dir.into(), threads, rounds))
}

/// Parses the options of `spine`.
fn parse_spine(args: &[String]) -> Result<spine::Options, Error> {
    let mut options = spine::Options::default();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if let Some(path) = arg.strip_prefix("--json=") {
            options.json = Some(path.into());
        } else if arg == "--json" {
            let path = args.next().ok_or("--json needs a PATH")?;
            options.json = Some(path.into());
        } else {
            return Err(format!("spine: unknown argument `{arg}`\n{USAGE}").into());
        }
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn no_arguments_mean_spine() {
        assert!(matches!(parse(&[]), Ok(Command::Spine(o)) if o.json.is_none()));
    }

    #[test]
    fn json_path_in_both_forms() {
        for a in [
            args(&["spine", "--json", "t.json"]),
            args(&["--json=t.json"]),
        ] {
            match parse(&a) {
                Ok(Command::Spine(o)) => assert_eq!(o.json.as_deref(), Some("t.json".as_ref())),
                other => panic!("{a:?} parsed as {other:?}"),
            }
        }
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(parse(&args(&["tun"])).is_err());
        assert!(parse(&args(&["spine", "--json"])).is_err());
        assert!(parse(&args(&["spine", "--fast"])).is_err());
    }

    #[test]
    fn compare_summary_takes_a_strategy_and_budgets_in_any_order() {
        match parse(&args(&[
            "compare-summary",
            "d",
            "--budgets",
            "64,128",
            "--strategy",
            "x",
        ])) {
            Ok(Command::CompareSummary(dir, s, b)) => {
                assert_eq!(dir, std::path::PathBuf::from("d"));
                assert_eq!(s, "x");
                assert_eq!(b, vec![64, 128]);
            }
            other => panic!("parsed as {other:?}"),
        }
        match parse(&args(&["compare-summary", "d"])) {
            Ok(Command::CompareSummary(_, s, b)) => assert!(s == "harl" && b.is_empty()),
            other => panic!("parsed as {other:?}"),
        }
        assert!(parse(&args(&["compare-summary", "d", "--budgets", "64,0"])).is_err());
        assert!(parse(&args(&["compare-summary", "d", "--budgets"])).is_err());
        assert!(parse(&args(&["compare-summary"])).is_err());
        assert!(matches!(
            parse(&args(&["compare-retime", "d", "--rounds", "3"])),
            Ok(Command::CompareRetime(_, 3))
        ));
        assert!(parse(&args(&["compare-retime", "d", "--rounds", "0"])).is_err());
    }
}
