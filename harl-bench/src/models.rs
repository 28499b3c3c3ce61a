//! `harl-bench models`: the kernels of BERT-base (sequence 128), ResNet-50, MobileNet-V2 and
//! batch-1 LLM decode GEMVs, each timed by harl's measurer (the shipped codegen, checked against
//! the interpreter) with its default schedule and, with `--trials N`, after an N-trial tune, at
//! each thread count; against onnxruntime (the same op or fused subgraph as an ONNX model) and,
//! for matmuls, numpy's BLAS, run by `scripts/peers.py` in the same sitting, before and after
//! harl (each peer figure the faster of the two). Before timing,
//! each kernel's graph is checked against onnxruntime on a small twin (the same kernel at
//! small sizes): the interpreter's output on the peer's inputs must match the peer's output.
//!
//! Prints one table per thread count (GFLOP/s, ratio to the best peer, geomean) and writes
//! `OUT/models.json`. The tuned column is what a build ships: the faster of the search's
//! winner and the default schedule, timed side by side (`harl_search_T` in the JSON is the
//! winner alone).

use crate::harness::{measure_schedules, run_tasks, RunSpec};
use crate::stats::median;
use crate::Error;
use harl_te::ops::{self, Activation, Conv2dParams};
use harl_te::{interp, DType, Expr, Graph, GraphBuilder};
use harl_tune::space::cpu::Task;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Options of `models`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Thread counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub threads: Vec<usize>,
    /// Also tune each kernel for this many trials (ansor, seed 0) and time the winner.
    #[arg(long)]
    pub trials: Option<usize>,
    /// Only kernels whose name contains one of these (e.g. `bert,gemv`).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Output directory (models.json, the peers' files).
    #[arg(long, default_value = "models-out")]
    pub out: PathBuf,
    /// The Python that runs onnxruntime and numpy.
    #[arg(long, default_value = "python3")]
    pub python: String,
}

/// What a kernel computes; sizes as in the model (convolutions pad `kernel / 2`).
#[derive(Clone, Debug, serde::Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum Kind {
    Dense {
        m: usize,
        k: usize,
        n: usize,
        bias: bool,
        residual: bool,
        act: Act,
    },
    Bmm {
        b: usize,
        m: usize,
        k: usize,
        n: usize,
    },
    Softmax {
        rows: usize,
        cols: usize,
    },
    LayerNorm {
        rows: usize,
        cols: usize,
    },
    Conv {
        c: usize,
        hw: usize,
        f: usize,
        kernel: usize,
        stride: usize,
        groups: usize,
        residual: bool,
        act: Act,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Act {
    None,
    Relu,
    Relu6,
    Gelu,
}

fn dense(m: usize, k: usize, n: usize, bias: bool, residual: bool, act: Act) -> Kind {
    Kind::Dense {
        m,
        k,
        n,
        bias,
        residual,
        act,
    }
}

fn conv(
    c: usize,
    hw: usize,
    f: usize,
    kernel: usize,
    stride: usize,
    residual: bool,
    act: Act,
) -> Kind {
    Kind::Conv {
        c,
        hw,
        f,
        kernel,
        stride,
        groups: 1,
        residual,
        act,
    }
}

fn depthwise(c: usize, hw: usize, stride: usize) -> Kind {
    Kind::Conv {
        c,
        hw,
        f: c,
        kernel: 3,
        stride,
        groups: c,
        residual: false,
        act: Act::Relu6,
    }
}

/// Every kernel of the benchmark, by model.
fn kernels() -> Vec<(&'static str, Kind)> {
    use Act::*;
    vec![
        // Square GEMMs (the share-of-peak target), the right operand a weight.
        ("gemm_512", dense(512, 512, 512, false, false, None)),
        ("gemm_1024", dense(1024, 1024, 1024, false, false, None)),
        // BERT-base, sequence 128: hidden 768, 12 heads of 64, FFN 3072.
        ("bert_qkv", dense(128, 768, 2304, true, false, None)),
        (
            "bert_qk",
            Kind::Bmm {
                b: 12,
                m: 128,
                k: 64,
                n: 128,
            },
        ),
        (
            "bert_softmax",
            Kind::Softmax {
                rows: 12 * 128,
                cols: 128,
            },
        ),
        (
            "bert_av",
            Kind::Bmm {
                b: 12,
                m: 128,
                k: 128,
                n: 64,
            },
        ),
        ("bert_out_residual", dense(128, 768, 768, true, true, None)),
        (
            "bert_layernorm",
            Kind::LayerNorm {
                rows: 128,
                cols: 768,
            },
        ),
        ("bert_ffn_up_gelu", dense(128, 768, 3072, true, false, Gelu)),
        (
            "bert_ffn_down_residual",
            dense(128, 3072, 768, true, true, None),
        ),
        // ResNet-50 at 224: its distinct convolutions (bias, then the residual add, then ReLU).
        ("resnet_stem_7x7s2", conv(3, 224, 64, 7, 2, false, Relu)),
        ("resnet_s1_1x1_64", conv(64, 56, 64, 1, 1, false, Relu)),
        ("resnet_s1_3x3_64", conv(64, 56, 64, 3, 1, false, Relu)),
        (
            "resnet_s1_1x1_256_residual",
            conv(64, 56, 256, 1, 1, true, Relu),
        ),
        (
            "resnet_s1_1x1_256to64",
            conv(256, 56, 64, 1, 1, false, Relu),
        ),
        ("resnet_s2_3x3s2_128", conv(128, 56, 128, 3, 2, false, Relu)),
        ("resnet_s2_3x3_128", conv(128, 28, 128, 3, 1, false, Relu)),
        (
            "resnet_s2_1x1_512_residual",
            conv(128, 28, 512, 1, 1, true, Relu),
        ),
        (
            "resnet_s2_downsample_1x1s2",
            conv(256, 56, 512, 1, 2, false, None),
        ),
        ("resnet_s3_3x3s2_256", conv(256, 28, 256, 3, 2, false, Relu)),
        // The later downsamples as the network fuses them: with the block's residual and ReLU.
        (
            "resnet_s3_downsample_1x1s2_residual",
            conv(512, 28, 1024, 1, 2, true, Relu),
        ),
        ("resnet_s3_3x3_256", conv(256, 14, 256, 3, 1, false, Relu)),
        (
            "resnet_s3_1x1_1024_residual",
            conv(256, 14, 1024, 1, 1, true, Relu),
        ),
        ("resnet_s4_3x3s2_512", conv(512, 14, 512, 3, 2, false, Relu)),
        (
            "resnet_s4_downsample_1x1s2_residual",
            conv(1024, 14, 2048, 1, 2, true, Relu),
        ),
        ("resnet_s4_3x3_512", conv(512, 7, 512, 3, 1, false, Relu)),
        (
            "resnet_s4_1x1_2048_residual",
            conv(512, 7, 2048, 1, 1, true, Relu),
        ),
        ("resnet_fc", dense(1, 2048, 1000, true, false, None)),
        // MobileNet-V2 at 224: depthwise 3x3 (ReLU6) at each resolution, pointwise 1x1.
        ("mbv2_dw_112_s1", depthwise(32, 112, 1)),
        ("mbv2_dw_112_s2", depthwise(96, 112, 2)),
        ("mbv2_dw_56_s1", depthwise(144, 56, 1)),
        ("mbv2_dw_56_s2", depthwise(144, 56, 2)),
        ("mbv2_dw_28_s1", depthwise(192, 28, 1)),
        ("mbv2_dw_28_s2", depthwise(192, 28, 2)),
        ("mbv2_dw_14_s1", depthwise(576, 14, 1)),
        ("mbv2_dw_14_s2", depthwise(576, 14, 2)),
        ("mbv2_dw_7_s1", depthwise(960, 7, 1)),
        ("mbv2_pw_112_16to96", conv(16, 112, 96, 1, 1, false, Relu6)),
        (
            "mbv2_pw_56_144to24_residual",
            conv(144, 56, 24, 1, 1, true, None),
        ),
        ("mbv2_pw_28_32to192", conv(32, 28, 192, 1, 1, false, Relu6)),
        ("mbv2_pw_14_96to576", conv(96, 14, 576, 1, 1, false, Relu6)),
        (
            "mbv2_pw_7_320to1280",
            conv(320, 7, 1280, 1, 1, false, Relu6),
        ),
        // Batch-1 LLM decode (a 7B model's projections).
        ("gemv_4096x4096", dense(1, 4096, 4096, false, false, None)),
        ("gemv_4096x11008", dense(1, 4096, 11008, false, false, None)),
        ("gemv_11008x4096", dense(1, 11008, 4096, false, false, None)),
    ]
}

impl Kind {
    /// The same kernel at small sizes, for checking the graph against the peer.
    fn small(&self) -> Kind {
        let s = |v: usize, cap: usize| v.min(cap);
        match self.clone() {
            Kind::Dense {
                m,
                k,
                n,
                bias,
                residual,
                act,
            } => Kind::Dense {
                m: s(m, 5),
                k: s(k, 19),
                n: s(n, 7),
                bias,
                residual,
                act,
            },
            Kind::Bmm { b, m, k, n } => Kind::Bmm {
                b: s(b, 2),
                m: s(m, 5),
                k: s(k, 9),
                n: s(n, 6),
            },
            Kind::Softmax { cols, .. } => Kind::Softmax {
                rows: 3,
                cols: s(cols, 17),
            },
            Kind::LayerNorm { cols, .. } => Kind::LayerNorm {
                rows: 3,
                cols: s(cols, 17),
            },
            Kind::Conv {
                c,
                f,
                kernel,
                stride,
                groups,
                residual,
                act,
                ..
            } => {
                let (c, f) = if groups == 1 {
                    (s(c, 3), s(f, 4))
                } else {
                    (3, 3)
                };
                Kind::Conv {
                    c,
                    hw: 9,
                    f,
                    kernel,
                    stride,
                    groups: if groups == 1 { 1 } else { 3 },
                    residual,
                    act,
                }
            }
        }
    }

    fn pad(kernel: usize) -> usize {
        kernel / 2
    }

    /// The spec `peers.py` reads: the kind's fields, tagged, and the kernel's name.
    fn spec(&self, name: &str) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        v["name"] = json!(name);
        v
    }

    /// harl's graph of the kernel, inputs in the order `peers.py` writes them; what it makes
    /// initializers (onnxruntime prepacks those once per session) are harl's weights, prepared
    /// once too.
    fn graph(&self) -> Result<Graph, Error> {
        const F: DType = DType::F32;
        let mut g = GraphBuilder::new();
        match *self {
            Kind::Dense {
                m,
                k,
                n,
                bias,
                residual,
                act,
            } => {
                let x = g.input("x", &[m, k], F);
                let w = g.weight("w", &[k, n], F);
                let b = bias.then(|| g.weight("bias", &[n], F));
                let r = residual.then(|| g.input("residual", &[m, n], F));
                // Without a residual add, GELU and ReLU fuse into the dense op's epilogue.
                let fused = match (act, r) {
                    (Act::Gelu, None) => Activation::Gelu,
                    (Act::Relu, None) => Activation::Relu,
                    _ => Activation::None,
                };
                let y = ops::dense(&mut g, x, w, b, fused)?;
                let rest = if fused == Activation::None {
                    act
                } else {
                    Act::None
                };
                epilogue(&mut g, y, r, rest)?;
            }
            Kind::Bmm { b, m, k, n } => {
                let a = g.input("a", &[b, m, k], F);
                let w = g.input("b", &[b, k, n], F);
                ops::batch_matmul(&mut g, a, w, false, false)?;
            }
            Kind::Softmax { rows, cols } => {
                let x = g.input("x", &[rows, cols], F);
                ops::softmax(&mut g, x, -1)?;
            }
            Kind::LayerNorm { rows, cols } => {
                let x = g.input("x", &[rows, cols], F);
                let gamma = g.weight("gamma", &[cols], F);
                let beta = g.weight("beta", &[cols], F);
                ops::layer_norm(&mut g, x, gamma, beta, 1e-5)?;
            }
            Kind::Conv {
                c,
                hw,
                f,
                kernel,
                stride,
                groups,
                residual,
                act,
            } => {
                let x = g.input("x", &[1, c, hw, hw], F);
                let w = g.weight("w", &[f, c / groups, kernel, kernel], F);
                let bias = g.weight("bias", &[f, 1, 1], F);
                let out = (hw + 2 * Kind::pad(kernel) - kernel) / stride + 1;
                let r = residual.then(|| g.input("residual", &[1, f, out, out], F));
                let p = Conv2dParams {
                    stride: (stride, stride),
                    pad: (Kind::pad(kernel), Kind::pad(kernel)),
                    dilation: (1, 1),
                    groups,
                };
                let y = ops::conv2d(&mut g, x, w, p)?;
                let y = ops::add(&mut g, y, bias)?;
                epilogue(&mut g, y, r, act)?;
            }
        }
        Ok(g.finish()?)
    }
}

/// The graph of the benchmark's kernel `name`, if there is one (`probe` takes these names).
pub fn kernel_graph(name: &str) -> Option<Result<Graph, Error>> {
    kernels()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, k)| k.graph())
}

/// The workload keys of the benchmark's kernels (the cost models' dataset must not hold them).
#[cfg(test)]
pub fn workload_keys() -> Result<Vec<String>, Error> {
    kernels()
        .iter()
        .map(|(_, k)| Ok(k.graph()?.workload_key()))
        .collect()
}

/// The residual add, if any, then the activation's stage, as the models order them.
fn epilogue(
    g: &mut GraphBuilder,
    y: harl_te::TensorRef,
    residual: Option<harl_te::TensorRef>,
    act: Act,
) -> Result<(), Error> {
    let y = match residual {
        Some(r) => ops::add(g, y, r)?,
        None => y,
    };
    match act {
        Act::None => {}
        Act::Relu => {
            ops::relu(g, y)?;
        }
        Act::Relu6 => {
            ops::unary(g, y, |e| e.max(Expr::f32(0.0)).min(Expr::f32(6.0)), "relu6")?;
        }
        Act::Gelu => {
            ops::gelu(g, y)?;
        }
    }
    Ok(())
}

/// Reads a raw little-endian f32 file.
fn read_f32(path: &Path) -> Result<Vec<f64>, Error> {
    let bytes = std::fs::read(path)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        .collect())
}

/// The interpreter on the small twin, on the peer's inputs, against the peer's output.
fn check_small(name: &str, kind: &Kind, dir: &Path) -> Result<f64, Error> {
    let graph = kind.small().graph()?;
    let inputs: Vec<Vec<f64>> = (0..graph.inputs.len())
        .map(|i| read_f32(&dir.join(format!("{name}.in{i}.bin"))))
        .collect::<Result<_, _>>()?;
    let refs: Vec<&[f64]> = inputs.iter().map(Vec::as_slice).collect();
    let got = interp::run(&graph, &refs).map_err(|e| format!("{name}: {e}"))?;
    let want = read_f32(&dir.join(format!("{name}.out.bin")))?;
    if got.len() != want.len() {
        return Err(format!(
            "{name}: harl's graph has {} outputs, the peer's {}",
            got.len(),
            want.len()
        )
        .into());
    }
    Ok(got
        .iter()
        .zip(&want)
        .map(|(g, w)| (g - w).abs() / (1.0 + w.abs()))
        .fold(0.0, f64::max))
}

/// Runs the benchmark.
pub fn run(o: &Options) -> Result<(), Error> {
    std::fs::create_dir_all(&o.out)?;
    let chosen: Vec<(&str, Kind)> = kernels()
        .into_iter()
        .filter(|(n, _)| o.only.is_empty() || o.only.iter().any(|s| n.contains(s.as_str())))
        .collect();
    let specs: Vec<Value> = chosen
        .iter()
        .map(|(n, k)| {
            let mut s = k.spec(n);
            s["small"] = k.small().spec(n);
            s
        })
        .collect();
    let spec_path = o.out.join("specs.json");
    std::fs::write(&spec_path, serde_json::to_string_pretty(&specs)?)?;
    let check_dir = o.out.join("check");
    std::fs::create_dir_all(&check_dir)?;
    // The peers run before harl and again after it; each figure is the faster of the two, so
    // a noisy phase of a shared machine counts against harl, not for it.
    let first = run_peers(o, &spec_path, &o.out.join("peers-before.json"), &check_dir)?;
    // One thread's multiply-add peak in this sitting: the `% of peak` columns.
    let peak = harl::runtime::peak::fma_peak_flops(1.0) / 1e9;
    eprintln!("FMA peak, one thread: {peak:.1} GFLOP/s");
    let mut rows = Vec::new();
    for (name, kind) in &chosen {
        let err = check_small(name, kind, &check_dir)?;
        if err > 1e-4 {
            return Err(format!(
                "{name}: harl's graph differs from the peer's by {err:e} on the small twin"
            )
            .into());
        }
        let graph = kind.graph()?;
        let flops = graph.flops();
        let mut row = json!({"kernel": name, "flops": flops, "check_err": err});
        for &t in &o.threads {
            let default = crate::harness::measure_default(&graph, t, 0)?;
            row[format!("harl_default_{t}")] = json!(default);
            if let Some(trials) = o.trials {
                let tuned = run_tasks(
                    vec![Task::new(name.to_string(), graph.clone(), 1.0)],
                    &RunSpec {
                        strategy: "ansor",
                        scheduler: "round-robin",
                        trials,
                        seed: 0,
                        threads: t,
                        batch: 16,
                        seed_default: true,
                    },
                )?;
                let best = tuned
                    .tasks
                    .first()
                    .and_then(harl_tune::tuner::best_candidate);
                if let Some((c, _)) = best {
                    // The winner re-timed beside the default in one batch; a build ships the
                    // faster of the two (the search's space need not contain the default).
                    let [w, d] = measure_schedules(&graph, &c.schedule, t, 0)?;
                    let (w, d) = (median(&w), median(&d));
                    row[format!("harl_search_{t}")] = json!(w);
                    let shipped = match (w, d) {
                        (Some(w), Some(d)) => Some(w.min(d)),
                        (w, d) => w.or(d),
                    };
                    row[format!("harl_tuned_{t}")] = json!(shipped);
                }
            }
            let peer = &first["kernels"][*name];
            for p in ["ort", "blas"] {
                row[format!("{p}_{t}")] = peer[format!("{p}_{t}")].clone();
            }
        }
        eprintln!("{row}");
        rows.push(row);
    }
    let second = run_peers(o, &spec_path, &o.out.join("peers-after.json"), &check_dir)?;
    for row in &mut rows {
        for &t in &o.threads {
            for p in ["ort", "blas"] {
                let key = format!("{p}_{t}");
                let after = second["kernels"][row["kernel"].as_str().unwrap_or("")][&key].as_f64();
                let best = match (row[&key].as_f64(), after) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                row[key] = json!(best);
            }
        }
    }
    // The machine: CPU model and ISA class change between sittings, and ratios only compare
    // within one.
    let target = crate::dataset::bench_target();
    println!(
        "machine: {} ({}, {} cores)",
        target.cpu_model, target.isa_class, target.cores
    );
    println!("FMA peak, one thread: {peak:.1} GFLOP/s");
    let report = json!({"peers": [first, second], "rows": rows, "threads": o.threads, "trials": o.trials, "target": target, "fma_peak_gflops": peak});
    std::fs::write(
        o.out.join("models.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    for &t in &o.threads {
        print!("{}", table(&rows, t, o.trials.is_some(), peak * t as f64));
    }
    Ok(())
}

/// Runs `scripts/peers.py` on the specs (writing the small twins' data into `check_dir`) and
/// returns what it measured.
fn run_peers(o: &Options, spec_path: &Path, out: &Path, check_dir: &Path) -> Result<Value, Error> {
    let threads: Vec<String> = o.threads.iter().map(|t| t.to_string()).collect();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/peers.py");
    eprintln!("peers: onnxruntime and numpy ({})", o.python);
    let status = Command::new(&o.python)
        .arg(&script)
        .arg(spec_path)
        .arg(out)
        .arg("--check-dir")
        .arg(check_dir)
        .env("PEER_THREADS", threads.join(","))
        // Older OpenBLAS builds need these on some CPUs; they slow a current numpy (see the
        // machine notes), so the peer runs without them.
        .env_remove("OPENBLAS_CORETYPE")
        .env_remove("OPENBLAS_L2_SIZE")
        .status()?;
    if !status.success() {
        return Err(format!(
            "{} failed ({status}); it needs `pip install onnxruntime onnx numpy threadpoolctl`",
            script.display()
        )
        .into());
    }
    Ok(serde_json::from_str(&std::fs::read_to_string(out)?)?)
}

/// One thread count's table: GFLOP/s of harl (default, tuned) and the peers, harl's best over
/// the best peer, the default's share of `peak` (GFLOP/s of the thread count), and the geomean
/// of those ratios.
fn table(rows: &[Value], t: usize, tuned: bool, peak: f64) -> String {
    let gf = |row: &Value, key: String| {
        row[&key]
            .as_f64()
            .filter(|s| *s > 0.0)
            .map(|s| row["flops"].as_f64().unwrap_or(0.0) / s / 1e9)
    };
    let cell = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    let mut out = format!(
        "\n{t} thread(s), GFLOP/s (peak {peak:.1})\n| kernel | harl default | {}onnxruntime | numpy BLAS | default / best peer | default / peak |{}\n|---|---|---|---|---|---|{}\n",
        if tuned { "harl tuned | " } else { "" },
        if tuned { " tuned / best peer |" } else { "" },
        if tuned { "---|---|" } else { "" },
    );
    let (mut logs_d, mut logs_t) = (Vec::new(), Vec::new());
    for row in rows {
        let d = gf(row, format!("harl_default_{t}"));
        let tu = gf(row, format!("harl_tuned_{t}"));
        let ort = gf(row, format!("ort_{t}"));
        let blas = gf(row, format!("blas_{t}"));
        let peer = ort
            .into_iter()
            .chain(blas)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
        let ratio = |h: Option<f64>| match (h, peer) {
            (Some(h), Some(p)) => Some(h / p),
            _ => None,
        };
        if let Some(r) = ratio(d) {
            logs_d.push(r.ln());
        }
        if let Some(r) = ratio(tu) {
            logs_t.push(r.ln());
        }
        let r = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}x"));
        let share = d.filter(|_| peak > 0.0).map(|d| d / peak);
        out.push_str(&format!(
            "| {} | {} | {}{} | {} | {} | {} |{}\n",
            row["kernel"].as_str().unwrap_or("?"),
            cell(d),
            if tuned {
                format!("{} | ", cell(tu))
            } else {
                String::new()
            },
            cell(ort),
            cell(blas),
            r(ratio(d)),
            share.map_or("-".to_string(), |v| format!("{:.0}%", 100.0 * v)),
            if tuned {
                format!(" {} |", r(ratio(tu)))
            } else {
                String::new()
            },
        ));
    }
    let geo = |v: &[f64]| {
        if v.is_empty() {
            "-".to_string()
        } else {
            format!("{:.2}x", (v.iter().sum::<f64>() / v.len() as f64).exp())
        }
    };
    out.push_str(&if tuned {
        format!(
            "| geomean | | | | | {} | | {} |\n",
            geo(&logs_d),
            geo(&logs_t)
        )
    } else {
        format!("| geomean | | | | {} | |\n", geo(&logs_d))
    });
    out
}
