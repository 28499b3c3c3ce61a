//! The tuning benchmark suite and workload specs (`matmul:m=257,k=511,n=129`).

use harl_te::ops::workloads as w;
use harl_te::Graph;
use std::collections::BTreeMap;

/// A workload of the suite, or one given as a spec.
#[derive(Clone, Debug)]
pub struct SuiteWorkload {
    /// Suite name or the spec as given.
    pub name: String,
    /// The spec it stands for.
    pub spec: String,
}

/// The suite: fp32, batch 1 (name, spec).
pub const SUITE: &[(&str, &str)] = &[
    ("gemm_128", "matmul:m=128,k=128,n=128"),
    ("gemm_512", "matmul:m=512,k=512,n=512"),
    ("gemm_1024", "matmul:m=1024,k=1024,n=1024"),
    ("gemm_128x768x3072", "matmul:m=128,k=768,n=3072"),
    ("batch_gemm", "batch_matmul:b=12,m=128,k=64,n=128"),
    ("conv1d", "conv1d:n=1,c=64,l=256,f=128,k=3,stride=1,pad=1"),
    (
        "conv2d_56",
        "conv2d:n=1,c=64,h=56,w=56,f=64,kh=3,kw=3,stride=1,pad=1",
    ),
    (
        "conv2d_224",
        "conv2d:n=1,c=3,h=224,w=224,f=64,kh=7,kw=7,stride=2,pad=3",
    ),
    (
        "depthwise_112",
        "depthwise:n=1,c=32,h=112,w=112,kh=3,kw=3,stride=1,pad=1",
    ),
    (
        "conv3d",
        "conv3d:n=1,c=64,d=16,h=56,w=56,f=64,kd=3,kh=3,kw=3,stride=1,pad=1",
    ),
    (
        "conv2d_transpose",
        "conv2d_transpose:n=1,c=512,h=4,w=4,f=256,kh=4,kw=4,stride=2,pad=1",
    ),
];

/// A spec key and its default (`None` = required).
type Key = (&'static str, Option<usize>);

/// Keys each op takes.
const KEYS: &[(&str, &[Key])] = &[
    ("matmul", &[("m", None), ("k", None), ("n", None)]),
    ("dense", &[("m", None), ("k", None), ("n", None)]),
    (
        "batch_matmul",
        &[("b", None), ("m", None), ("k", None), ("n", None)],
    ),
    (
        "conv1d",
        &[
            ("n", Some(1)),
            ("c", None),
            ("l", None),
            ("f", None),
            ("k", None),
            ("stride", Some(1)),
            ("pad", Some(0)),
            ("dilation", Some(1)),
            ("groups", Some(1)),
        ],
    ),
    (
        "conv2d",
        &[
            ("n", Some(1)),
            ("c", None),
            ("h", None),
            ("w", None),
            ("f", None),
            ("kh", None),
            ("kw", None),
            ("stride", Some(1)),
            ("pad", Some(0)),
            ("dilation", Some(1)),
            ("groups", Some(1)),
        ],
    ),
    (
        "depthwise",
        &[
            ("n", Some(1)),
            ("c", None),
            ("h", None),
            ("w", None),
            ("kh", None),
            ("kw", None),
            ("stride", Some(1)),
            ("pad", Some(0)),
            ("dilation", Some(1)),
        ],
    ),
    (
        "conv3d",
        &[
            ("n", Some(1)),
            ("c", None),
            ("d", None),
            ("h", None),
            ("w", None),
            ("f", None),
            ("kd", None),
            ("kh", None),
            ("kw", None),
            ("stride", Some(1)),
            ("pad", Some(0)),
            ("dilation", Some(1)),
            ("groups", Some(1)),
        ],
    ),
    (
        "conv2d_transpose",
        &[
            ("n", Some(1)),
            ("c", None),
            ("h", None),
            ("w", None),
            ("f", None),
            ("kh", None),
            ("kw", None),
            ("stride", Some(1)),
            ("pad", Some(0)),
            ("dilation", Some(1)),
        ],
    ),
    ("softmax", &[("rows", None), ("cols", None)]),
    ("layer_norm", &[("rows", None), ("cols", None)]),
];

/// Resolves a suite name or a spec to a workload.
pub fn resolve(name_or_spec: &str) -> Result<SuiteWorkload, String> {
    if let Some((name, spec)) = SUITE.iter().find(|(n, _)| *n == name_or_spec) {
        return Ok(SuiteWorkload {
            name: name.to_string(),
            spec: spec.to_string(),
        });
    }
    if name_or_spec.contains(':') {
        build(name_or_spec)?;
        return Ok(SuiteWorkload {
            name: name_or_spec.to_string(),
            spec: name_or_spec.to_string(),
        });
    }
    Err(format!("unknown workload `{name_or_spec}`; see --list, or give a spec such as matmul:m=64,k=64,n=64"))
}

/// The key-value pairs of a spec, defaults filled in.
pub fn parse(spec: &str) -> Result<(String, BTreeMap<String, usize>), String> {
    let (op, rest) = spec
        .split_once(':')
        .ok_or_else(|| format!("`{spec}`: expected op:key=value,..."))?;
    let (_, keys) = KEYS.iter().find(|(o, _)| *o == op).ok_or_else(|| {
        format!(
            "unknown op `{op}`; ops: {}",
            KEYS.iter().map(|(o, _)| *o).collect::<Vec<_>>().join(", ")
        )
    })?;
    let mut values = BTreeMap::new();
    for kv in rest.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("`{kv}`: expected key=value"))?;
        if !keys.iter().any(|(name, _)| *name == k) {
            let known: Vec<&str> = keys.iter().map(|(n, _)| *n).collect();
            return Err(format!("{op} has no key `{k}`; keys: {}", known.join(", ")));
        }
        let v: usize = v
            .parse()
            .map_err(|_| format!("`{kv}`: the value must be a positive integer"))?;
        values.insert(k.to_string(), v);
    }
    for (k, default) in keys.iter() {
        if !values.contains_key(*k) {
            let v = default.ok_or_else(|| format!("{op} needs `{k}`"))?;
            values.insert(k.to_string(), v);
        }
    }
    Ok((op.to_string(), values))
}

/// Builds the graph of a spec.
pub fn build(spec: &str) -> Result<Graph, String> {
    let (op, v) = parse(spec)?;
    let g = |k: &str| v.get(k).copied().unwrap_or(0);
    let graph = match op.as_str() {
        "matmul" => w::matmul(g("m"), g("k"), g("n")),
        "dense" => w::dense_bias_relu(g("m"), g("k"), g("n")),
        "batch_matmul" => w::batch_matmul(g("b"), g("m"), g("k"), g("n")),
        "conv1d" => w::conv1d(
            g("n"),
            g("c"),
            g("l"),
            g("f"),
            g("k"),
            g("stride"),
            g("pad"),
            g("dilation"),
            g("groups"),
        ),
        "conv2d" => w::conv2d(
            g("n"),
            g("c"),
            g("h"),
            g("w"),
            g("f"),
            g("kh"),
            g("kw"),
            g("stride"),
            g("pad"),
            g("dilation"),
            g("groups"),
        ),
        "depthwise" => w::depthwise_conv2d(
            g("n"),
            g("c"),
            g("h"),
            g("w"),
            g("kh"),
            g("kw"),
            g("stride"),
            g("pad"),
            g("dilation"),
        ),
        "conv3d" => w::conv3d(
            g("n"),
            g("c"),
            g("d"),
            g("h"),
            g("w"),
            g("f"),
            g("kd"),
            g("kh"),
            g("kw"),
            g("stride"),
            g("pad"),
            g("dilation"),
            g("groups"),
        ),
        "conv2d_transpose" => w::conv2d_transpose(
            g("n"),
            g("c"),
            g("h"),
            g("w"),
            g("f"),
            g("kh"),
            g("kw"),
            g("stride"),
            g("pad"),
            g("dilation"),
        ),
        "softmax" => w::softmax(g("rows"), g("cols")),
        "layer_norm" => w::layer_norm(g("rows"), g("cols")),
        other => return Err(format!("unknown op `{other}`")),
    };
    graph.map_err(|e| format!("`{spec}`: {e}"))
}

/// The GEMM shape (m, k, n) of a spec the `gemm` crate can run directly, if any.
pub fn gemm_shape(spec: &str) -> Option<(usize, usize, usize)> {
    let (op, v) = parse(spec).ok()?;
    (op == "matmul").then(|| (v["m"], v["k"], v["n"]))
}

/// Lines for `--list`.
pub fn list() -> String {
    let mut out = String::from("suite workloads (fp32, batch 1):\n");
    for (name, spec) in SUITE {
        out.push_str(&format!("  {name:<20} {spec}\n"));
    }
    out.push_str("spec keys (defaults in parentheses):\n");
    for (op, keys) in KEYS {
        let ks: Vec<String> = keys
            .iter()
            .map(|(k, d)| d.map_or(k.to_string(), |d| format!("{k}({d})")))
            .collect();
        out.push_str(&format!("  {op}: {}\n", ks.join(",")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_suite_workload_builds() {
        for (name, spec) in SUITE {
            let g = build(spec).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(g.flops() > 0.0, "{name}");
        }
    }

    #[test]
    fn specs_parse_with_defaults_and_reject_unknown_keys() {
        let g = build("matmul:m=257,k=511,n=129").expect("matmul");
        assert_eq!(
            g.stages.last().map(|s| s.shape.clone()),
            Some(vec![257, 129])
        );
        assert!(build("conv2d:c=3,h=8,w=8,f=4,kh=3,kw=3").is_ok());
        assert!(build("matmul:m=2,k=2").is_err());
        assert!(build("matmul:m=2,k=2,n=2,q=1").is_err());
        assert!(resolve("nope").is_err());
        assert_eq!(gemm_shape("matmul:m=1,k=2,n=3"), Some((1, 2, 3)));
    }
}
