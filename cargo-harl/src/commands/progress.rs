//! Live progress of a tune: a bar per job (one crate's kernels, tuned together) on a terminal
//! (trials / budget, the kernel just measured and its best GFLOP/s so far, ETA), plain lines
//! elsewhere (a build script's log, CI), and the closing table.

use std::io::IsTerminal;
use std::time::Instant;

use harl_build::directive::escape;
use harl_build::manifest::TuneOutcome;
use harl_tune::job::Progress;
use indicatif::{ProgressBar, ProgressStyle};

/// Progress on stderr: bars on a terminal, lines otherwise.
pub struct Live {
    bar: Option<ProgressBar>,
    terminal: bool,
    /// What the job tunes (a kernel, or "N kernels").
    kernel: String,
    budget: usize,
    started: Instant,
    /// The job's position among the tool's jobs and their number, for "[2/5]".
    pub position: (usize, usize),
}

impl Live {
    /// Bars when stderr is a terminal.
    pub fn new(total: usize) -> Self {
        Live {
            bar: None,
            terminal: std::io::stderr().is_terminal(),
            kernel: String::new(),
            budget: 0,
            started: Instant::now(),
            position: (0, total),
        }
    }
}

fn gflops(g: Option<f64>) -> String {
    g.map_or("-".into(), |g| format!("{g:.1} GFLOP/s"))
}

impl Progress for Live {
    fn start(&mut self, kernel: &str, budget: usize) {
        self.position.0 += 1;
        self.kernel = escape(kernel);
        self.budget = budget;
        self.started = Instant::now();
        let prefix = format!("[{}/{}] {}", self.position.0, self.position.1, self.kernel);
        if self.terminal {
            let bar = ProgressBar::new(budget as u64);
            if let Ok(style) = ProgressStyle::with_template(
                "{prefix:.bold} [{bar:30}] {pos}/{len} trials, best of {msg}, {elapsed} (ETA {eta})",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix(prefix);
            bar.set_message("-");
            self.bar = Some(bar);
        } else {
            eprintln!("{prefix}: tuning, {budget} trials");
        }
    }

    fn advance(&mut self, trials: usize, kernel: &str, best_gflops: Option<f64>) {
        let best = format!("{}: {}", escape(kernel), gflops(best_gflops));
        match &self.bar {
            Some(bar) => {
                bar.set_position(trials as u64);
                bar.set_message(best);
            }
            None => eprintln!(
                "{}: {trials}/{} trials, {best}, {:.0} s",
                self.kernel,
                self.budget,
                self.started.elapsed().as_secs_f64()
            ),
        }
    }

    fn finish(&mut self, outcome: &TuneOutcome) {
        if let Some(bar) = self.bar.take() {
            bar.finish();
        }
        if let Some(note) = &outcome.note {
            eprintln!("{}: {}", escape(&outcome.name), escape(note));
        }
    }
}

/// The closing table (TVM's tuning statistics): kernel, default and tuned latency, speed-up,
/// trials, time.
pub fn table(outcomes: &[TuneOutcome]) -> String {
    let ms = |l: Option<f64>| l.map_or("failed".to_string(), |l| format!("{:.4}", l * 1e3));
    let mut rows = vec![[
        "kernel".to_string(),
        "default ms".into(),
        "tuned ms".into(),
        "speed-up".into(),
        "trials".into(),
        "time s".into(),
    ]];
    for o in outcomes {
        let speedup = match (o.default_latency_s, o.latency_s) {
            (Some(d), Some(t)) if t > 0.0 => format!("{:.2}x", d / t),
            _ => "-".into(),
        };
        rows.push([
            escape(&o.name),
            ms(o.default_latency_s),
            ms(o.latency_s),
            speedup,
            o.trials.to_string(),
            format!("{:.0}", o.wall_s),
        ]);
    }
    render(&rows)
}

/// Rows as aligned columns (the first column left-aligned, the rest right-aligned).
pub fn render<const N: usize>(rows: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (i, row) in rows.iter().enumerate() {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| {
                if c == 0 {
                    format!("{cell:<w$}", w = widths[c])
                } else {
                    format!("{cell:>w$}", w = widths[c])
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
        if i == 0 {
            out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (N - 1)));
            out.push('\n');
        }
    }
    out
}
