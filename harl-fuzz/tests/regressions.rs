//! Replays the saved fuzz corpus (`regressions/<target>/*`) through the target bodies, so that
//! `cargo test` on stable re-checks every seed, every minimized interesting input and every
//! crash the fuzzer ever found. Files under `pending/` (crashes whose fix has not landed) are
//! not replayed; move them into `regressions/` with the fix.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("regressions")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Runs every file of `target`'s corpus, then fails naming all inputs that panicked (not just
/// the first), so one regression does not hide another.
fn replay(target: &str, run: fn(&[u8])) {
    let files = corpus(target);
    assert!(!files.is_empty(), "no corpus for {target}");
    let failed: Vec<String> = files
        .iter()
        .filter(|path| {
            let data = std::fs::read(path).expect("read corpus file");
            catch_unwind(AssertUnwindSafe(|| run(&data))).is_err()
        })
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} {target} inputs panicked:\n{}",
        failed.len(),
        files.len(),
        failed.join("\n")
    );
}

#[test]
fn dsl_corpus() {
    replay("dsl", harl_fuzz::dsl);
}

#[test]
fn cache_line_corpus() {
    replay("cache_line", harl_fuzz::cache_line);
}

#[test]
fn steps_corpus() {
    replay("steps", harl_fuzz::steps);
}

#[test]
fn onnx_corpus() {
    replay("onnx", harl_fuzz::onnx);
}

/// The hand-written DSL seeds are only useful while they reach the lowering: a seed named
/// `seed-*` (but not `seed-err-*`, the rejected ones) must still parse as a kernel. Without this
/// a change to the DSL could silently turn the corpus into parse errors.
#[test]
fn dsl_seeds_parse() {
    let mut broken = Vec::new();
    for path in corpus("dsl") {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("seed-") || name.starts_with("seed-err-") {
            continue;
        }
        let src = std::fs::read_to_string(&path).expect("utf-8 seed");
        let item: syn::ItemFn = syn::parse_str(&src).unwrap_or_else(|e| panic!("{name}: {e}"));
        let attr = item
            .attrs
            .iter()
            .find(|a| harl_te::dsl::is_kernel_attr(a))
            .expect("kernel attribute");
        let args = match &attr.meta {
            syn::Meta::List(l) => l.tokens.clone(),
            _ => Default::default(),
        };
        if let Err(e) = harl_te::dsl::parse_kernel(args, &item) {
            broken.push(format!("{name}: {e}"));
        }
    }
    assert!(
        broken.is_empty(),
        "seeds that no longer parse:\n{}",
        broken.join("\n")
    );
}

/// The cache-line seeds named `seed-valid-*` must parse as records, so that the corpus keeps
/// reaching lowering.
#[test]
fn cache_line_seeds_parse() {
    for path in corpus("cache_line") {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("seed-valid-") {
            let data = std::fs::read(&path).expect("read seed");
            if let Err(e) = harl_build::cache::parse_record(&data) {
                panic!("{name} is no longer a record: {e}");
            }
        }
    }
}
