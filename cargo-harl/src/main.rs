//! `cargo harl`: harl's tool, installed once per machine (`cargo install --path cargo-harl`).
//!
//! - `cargo harl tune`: tunes a crate's kernels on this machine and writes its `tuning-cache/`
//!   (a build script with `HARL_TUNE=on` calls the same command with `--manifest`);
//! - `cargo harl report`: the tuning table and best-so-far plots of the last tunes;
//! - `cargo harl cache list|merge|verify|prune`: tuning-cache files;
//! - `cargo harl cache retime`: a crate's records timed again beside today's defaults.
//!
//! Cargo runs `cargo-harl harl <args>` for `cargo harl <args>`; running `cargo-harl` by hand
//! takes the same arguments after `harl`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

mod commands;

/// `cargo` passes the subcommand's name as the first argument.
#[derive(Parser)]
#[command(name = "cargo", bin_name = "cargo")]
enum Cargo {
    /// harl's tool: tune a crate's kernels, report, maintain tuning caches.
    Harl(Harl),
}

/// The `harl` subcommand.
#[derive(Args)]
#[command(
    version,
    about = "harl's tool: tune a crate's kernels on this machine, report, maintain tuning caches"
)]
struct Harl {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Tunes the crate's kernels that have no record for this CPU and records the winners.
    Tune(commands::tune::TuneArgs),
    /// The tuning table and best-so-far curves (SVG) of the crate's last tunes.
    Report(commands::report::ReportArgs),
    /// Tuning-cache files (`<isa-class>.jsonl`).
    #[command(subcommand)]
    Cache(CacheCommand),
}

/// What to do with cache files.
#[derive(Subcommand)]
pub enum CacheCommand {
    /// Lists every record (kernel, workload key, target, latency, trials, steps) and every line
    /// that is not one.
    List {
        /// Cache files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Merges files, keeping the fastest record per (workload, target), never a duplicate.
    Merge {
        /// Cache files to merge (the output may be one of them).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// A cache directory (one `<isa-class>.jsonl` per class is written) or a file (all
        /// records must then be of one ISA class).
        #[arg(short, long)]
        out: PathBuf,
    },
    /// Checks every line: it parses, is filed under its ISA class and, with `--crate`, replays
    /// on the crate's kernel of that workload. Exits with 1 when a line fails.
    Verify {
        /// Cache files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// A crate whose `src/` declares the kernels (`#[harl::kernel]`) to replay records on.
        #[arg(long = "crate", value_name = "DIR")]
        krate: Option<PathBuf>,
    },
    /// Rewrites each file without its unusable lines (corrupt, unknown version, misfiled,
    /// unreplayable on the crate's kernels with `--crate`) and superseded records (slower than
    /// another record of the same workload and target).
    Prune {
        /// Cache files, rewritten in place.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// A crate whose `src/` declares the kernels to replay records on.
        #[arg(long = "crate", value_name = "DIR")]
        krate: Option<PathBuf>,
    },
    /// Times every record a crate's build could pick on this CPU beside the schedule it would
    /// use without it (this harl's default); with `--drop`, removes the records that lose.
    Retime(commands::retime::RetimeArgs),
}

fn main() -> ExitCode {
    let Cargo::Harl(harl) = Cargo::parse();
    let result: Result<ExitCode, Box<dyn std::error::Error>> = match harl.command {
        Command::Tune(args) => commands::tune::run(args).map_err(Into::into),
        Command::Report(args) => commands::report::run(args).map_err(Into::into),
        Command::Cache(c) => commands::cache::run(c).map_err(Into::into),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // Errors quote paths and file content: one line each.
            eprintln!(
                "cargo harl: {}",
                harl_build::directive::escape(&e.to_string())
            );
            ExitCode::from(2)
        }
    }
}
