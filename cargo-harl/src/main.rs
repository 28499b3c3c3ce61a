//! `cargo harl`: harl's tool, installed once per machine (`cargo install --path cargo-harl`).
//!
//! Today it reads and maintains tuning caches (`cargo harl cache list|merge|verify|prune`);
//! tuning a crate from the tool is still done by its build script (`HARL_TUNE=on`).
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
    /// harl's tool: tuning caches (tuning to come).
    Harl(Harl),
}

/// The `harl` subcommand.
#[derive(Args)]
#[command(version, about = "harl's tool: read and maintain tuning caches")]
struct Harl {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
}

fn main() -> ExitCode {
    let Cargo::Harl(harl) = Cargo::parse();
    let result = match harl.command {
        Command::Cache(c) => commands::cache::run(c),
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
