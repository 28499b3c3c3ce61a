//! `cargo harl report`: the tuning table of a crate's last tunes, read back from their trial
//! logs, and each kernel's best-so-far curve (GFLOP/s against trials) plotted as SVG and PNG.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use harl_build::directive::escape;
use harl_build::manifest::Manifest;
use harl_tune::job::{read_log, LogHeader, LogTrial};

use super::krate;
use super::progress::render;

/// `cargo harl report` arguments.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Where the kernels are.
    #[command(flatten)]
    pub kernels: krate::KernelsArgs,
    /// Where the plots go.
    #[arg(long, default_value = "harl-report")]
    pub out: PathBuf,
}

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The crate's kernels (its manifests) could not be found or read.
    #[error(transparent)]
    Crate(#[from] krate::CrateError),
    /// Writing a plot failed.
    #[error("{}: {why}", path.display())]
    Plot {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
}

/// One trial log, summarised.
struct Tune {
    header: LogHeader,
    /// (trial, best GFLOP/s so far) after every search trial.
    curve: Vec<(usize, f64)>,
    default_gflops: Option<f64>,
    seconds: f64,
}

fn summarise(header: LogHeader, trials: &[LogTrial]) -> Tune {
    let gflops = |l: f64| header.flops / l / 1e9;
    let default_gflops = trials
        .iter()
        .find(|t| t.default)
        .and_then(|t| t.latency_s)
        .map(gflops);
    let mut best = default_gflops.unwrap_or(0.0);
    let mut curve = Vec::new();
    for (i, t) in trials
        .iter()
        .filter(|t| !t.default && !t.final_round)
        .enumerate()
    {
        if let Some(l) = t.latency_s.filter(|l| *l > 0.0) {
            best = best.max(gflops(l));
        }
        if best > 0.0 {
            curve.push((i + 1, best));
        }
    }
    let seconds = trials.last().map_or(0.0, |t| t.elapsed_s);
    Tune {
        header,
        curve,
        default_gflops,
        seconds,
    }
}

/// The logs of one manifest's kernels.
fn tunes(manifest: &Manifest) -> Vec<Tune> {
    let dir = manifest.gen_dir.join("tune-log");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    paths.sort();
    paths
        .iter()
        .filter_map(|p| read_log(p))
        .filter(|(h, _)| {
            manifest
                .kernels
                .iter()
                .any(|k| k.workload_key == h.workload_key)
        })
        .map(|(h, t)| summarise(h, &t))
        .collect()
}

/// Runs the command.
pub fn run(args: ReportArgs) -> Result<ExitCode, ReportError> {
    let manifests: Vec<Manifest> = args.kernels.load()?.into_iter().map(|(_, m)| m).collect();
    let all: Vec<Tune> = manifests.iter().flat_map(tunes).collect();
    if all.is_empty() {
        println!("no tunes logged for this crate yet: run `cargo harl tune` first");
        return Ok(ExitCode::SUCCESS);
    }
    let mut rows = vec![[
        "kernel".to_string(),
        "strategy".into(),
        "seed".into(),
        "default GFLOP/s".into(),
        "tuned GFLOP/s".into(),
        "speed-up".into(),
        "trials".into(),
        "time s".into(),
    ]];
    for t in &all {
        let best = t.curve.last().map(|p| p.1);
        let g = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        rows.push([
            escape(&t.header.kernel),
            escape(&t.header.strategy),
            t.header.seed.to_string(),
            g(t.default_gflops),
            g(best),
            match (t.default_gflops, best) {
                (Some(d), Some(b)) if d > 0.0 => format!("{:.2}x", b / d),
                _ => "-".into(),
            },
            t.curve.last().map_or(0, |p| p.0).to_string(),
            format!("{:.0}", t.seconds),
        ]);
    }
    println!("{}", render(&rows));
    std::fs::create_dir_all(&args.out).map_err(|e| ReportError::Plot {
        path: args.out.clone(),
        why: e.to_string(),
    })?;
    let mut keys: Vec<&str> = all.iter().map(|t| t.header.workload_key.as_str()).collect();
    keys.dedup();
    for key in keys {
        let group: Vec<&Tune> = all
            .iter()
            .filter(|t| t.header.workload_key == key)
            .collect();
        let name: String = group[0]
            .header
            .kernel
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .take(64)
            .collect();
        for ext in ["svg", "png"] {
            let path = args.out.join(format!("{name}-{key}.{ext}"));
            plot(&path, &group).map_err(|why| ReportError::Plot {
                path: path.clone(),
                why,
            })?;
            println!("plotted {}", escape(&path.display().to_string()));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The plot's size in pixels.
const PLOT_SIZE: (u32, u32) = (900, 540);

/// Plots `tunes` into `path`: SVG or, for a `.png` path, a bitmap.
fn plot(path: &Path, tunes: &[&Tune]) -> Result<(), String> {
    use plotters::prelude::*;
    // Both backends lay text out with it.
    register_font();
    if path.extension().is_some_and(|e| e == "png") {
        draw(
            BitMapBackend::new(path, PLOT_SIZE).into_drawing_area(),
            tunes,
        )
    } else {
        draw(SVGBackend::new(path, PLOT_SIZE).into_drawing_area(), tunes)
    }
}

/// Registers the embedded font as `sans-serif` (once): plotters draws text with it.
fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Only fails on bytes that are not a font; these are a known font file.
        let _ = plotters::style::register_font(
            "sans-serif",
            plotters::style::FontStyle::Normal,
            epaint_default_fonts::UBUNTU_LIGHT,
        );
    });
}

/// Best-so-far GFLOP/s against trials, a line per logged tune, the default schedule dashed.
fn draw<DB: plotters::prelude::DrawingBackend>(
    root: plotters::drawing::DrawingArea<DB, plotters::coord::Shift>,
    tunes: &[&Tune],
) -> Result<(), String> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| e.to_string();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let trials = tunes
        .iter()
        .filter_map(|t| t.curve.last().map(|p| p.0))
        .max()
        .unwrap_or(1)
        .max(1);
    let top = tunes
        .iter()
        .flat_map(|t| t.curve.iter().map(|p| p.1).chain(t.default_gflops))
        .fold(1e-3f64, f64::max)
        * 1.1;
    let kernel: String = tunes[0]
        .header
        .kernel
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(64)
        .collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{kernel}: best-so-far GFLOP/s"), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(0f64..trials as f64, 0f64..top)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("trials")
        .y_desc("GFLOP/s")
        .draw()
        .map_err(|e| err(&e))?;
    let colors = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];
    for (i, t) in tunes.iter().enumerate() {
        let color = colors[i % colors.len()];
        let line = t.curve.iter().map(|&(x, y)| (x as f64, y));
        let label: String = format!("{} seed {}", t.header.strategy, t.header.seed)
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == ' ' || *c == '-')
            .take(48)
            .collect();
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        if let Some(d) = t.default_gflops {
            chart
                .draw_series(DashedLineSeries::new(
                    [(0.0, d), (trials as f64, d)],
                    6,
                    4,
                    color.stroke_width(1),
                ))
                .map_err(|e| err(&e))?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
