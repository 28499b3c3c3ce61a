//! Finds `#[harl::kernel]` items in a crate's sources.
//!
//! Items that fail to parse are skipped here: the attribute macro reports them with a span
//! when the crate compiles, which is the better place for the error. The walk reads regular
//! files only (a FIFO named `x.rs` would block the build), does not follow links to
//! directories (a link loop would never end) and stops [`MAX_SCAN_DEPTH`] directories down;
//! a file nested past what syn's recursive parser can take on a build script's stack is
//! skipped (rustc reports it, if it is a problem at all).

use harl_te::dsl::{check_token_limits, is_kernel_attr, parse_kernel, KernelDecl};
use std::path::{Path, PathBuf};

/// Directories below a scanned root that are still scanned.
pub const MAX_SCAN_DEPTH: usize = 32;
/// Deepest nesting of `()`, `[]` and `{}` in a scanned file. syn recurses once per level (about
/// 10 KiB of stack a level in a debug build), and the scan runs on [`SCAN_STACK_BYTES`].
pub const MAX_SCAN_NESTING: usize = 1024;
/// Longest run of tokens with no `,`, `;` or `{ }` block at one nesting level: syn parses a chain
/// `a + a + ...` into a tree as deep as the chain.
pub const MAX_SCAN_RUN: usize = 1 << 14;
/// Longest run of punctuation tokens in a scanned file: syn recurses once per prefix operator
/// and per `||` closure (`|| || || x`).
pub const MAX_SCAN_PUNCT_RUN: usize = 256;
/// Stack of the thread the scan runs on (reserved, not committed, until used).
pub const SCAN_STACK_BYTES: usize = 256 << 20;

/// Appends the kernels declared under `path` (a file or a directory, recursively) to `out`.
pub fn scan_path(path: &Path, out: &mut Vec<KernelDecl>) -> Result<(), (PathBuf, std::io::Error)> {
    walk(path, 0, out)
}

fn walk(
    path: &Path,
    depth: usize,
    out: &mut Vec<KernelDecl>,
) -> Result<(), (PathBuf, std::io::Error)> {
    let err = |e| (path.to_path_buf(), e);
    let Ok(link) = std::fs::symlink_metadata(path) else {
        return Ok(()); // Gone since it was listed, or never there.
    };
    if link.is_dir() {
        if depth >= MAX_SCAN_DEPTH {
            return Ok(());
        }
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(err)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for p in entries {
            walk(&p, depth + 1, out)?;
        }
    } else if path.extension().is_some_and(|e| e == "rs")
        && std::fs::metadata(path).is_ok_and(|m| m.is_file())
    {
        let src = std::fs::read_to_string(path).map_err(err)?;
        scan_source(&src, out);
    }
    Ok(())
}

/// Appends the kernels declared in one source file. Parses on a thread of its own with a
/// [`SCAN_STACK_BYTES`] stack, whatever the caller's stack is.
pub fn scan_source(src: &str, out: &mut Vec<KernelDecl>) {
    let scan = || {
        let mut found = Vec::new();
        let Ok(tokens) = src.parse::<proc_macro2::TokenStream>() else {
            return found;
        };
        if !within_parser_limits(&tokens) {
            return found;
        }
        if let Ok(file) = syn::parse2::<syn::File>(tokens) {
            scan_items(&file.items, &mut found);
        }
        found
    };
    let found = std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("harl-scan".into())
            .stack_size(SCAN_STACK_BYTES)
            .spawn_scoped(s, scan)
            .ok()
            .and_then(|h| h.join().ok())
    });
    // No thread (or a panic in it) finds no kernel: the macro then reports the item itself.
    out.extend(found.unwrap_or_default());
}

/// Whether syn can parse `tokens` without deep recursion: nesting, separator-free runs and
/// punctuation runs within [`MAX_SCAN_NESTING`], [`MAX_SCAN_RUN`] and [`MAX_SCAN_PUNCT_RUN`].
/// Walks with an explicit stack.
fn within_parser_limits(tokens: &proc_macro2::TokenStream) -> bool {
    use proc_macro2::TokenTree;
    let mut stack = vec![(tokens.clone().into_iter(), 0usize)];
    let mut puncts = 0usize;
    while let Some((top, run)) = stack.last_mut() {
        let Some(tt) = top.next() else {
            stack.pop();
            continue;
        };
        puncts = match &tt {
            TokenTree::Punct(_) => puncts + 1,
            _ => 0,
        };
        if puncts > MAX_SCAN_PUNCT_RUN {
            return false;
        }
        // Items, statements and arms end at `,`, `;` or a `{ }` block; a long binary chain
        // has none of those.
        *run = match &tt {
            TokenTree::Punct(p) if matches!(p.as_char(), ',' | ';') => 0,
            TokenTree::Group(g) if g.delimiter() == proc_macro2::Delimiter::Brace => 0,
            _ => *run + 1,
        };
        if *run > MAX_SCAN_RUN {
            return false;
        }
        if let TokenTree::Group(g) = tt {
            if stack.len() >= MAX_SCAN_NESTING {
                return false;
            }
            stack.push((g.stream().into_iter(), 0));
        }
    }
    true
}

fn scan_items(items: &[syn::Item], out: &mut Vec<KernelDecl>) {
    for item in items {
        match item {
            syn::Item::Fn(f) => {
                let Some(attr) = f.attrs.iter().find(|a| is_kernel_attr(a)) else {
                    continue;
                };
                let args = match &attr.meta {
                    syn::Meta::List(l) => l.tokens.clone(),
                    _ => Default::default(),
                };
                // The macro checks the same limits first: skip what it would reject.
                let item_tokens = quote::ToTokens::to_token_stream(f);
                if check_token_limits(&args).is_err() || check_token_limits(&item_tokens).is_err() {
                    continue;
                }
                if let Ok(decl) = parse_kernel(args, f) {
                    out.push(decl);
                }
            }
            syn::Item::Mod(m) => {
                if let Some((_, items)) = &m.content {
                    scan_items(items, out);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_kernels_in_nested_modules_and_skips_bad_ones() {
        let src = r#"
            use harl::kernel;
            #[harl::kernel(N = 8)]
            fn double(x: Tensor<f32, N>) -> Tensor<f32, N> { x * 2.0 }
            mod inner {
                #[kernel]
                pub fn neg1(x: Tensor<f32, 4>) -> Tensor<f32, 4> { -x }
                #[harl::kernel]
                fn broken(x: Tensor<f32, M>) -> Tensor<f32, 4> { x }
            }
            fn not_a_kernel() {}
        "#;
        let mut out = Vec::new();
        scan_source(src, &mut out);
        let names: Vec<&str> = out.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["double", "neg1"]);
    }

    #[test]
    fn deep_or_long_files_are_skipped_not_overflowed() {
        let kernel =
            "#[harl::kernel(N = 8)]\nfn double(x: Tensor<f32, N>) -> Tensor<f32, N> { x * 2.0 }\n";
        let deep = format!(
            "{kernel}const X: i32 = {}1{};",
            "(".repeat(5000),
            ")".repeat(5000)
        );
        let long = format!("{kernel}const Y: i32 = {};", vec!["1"; 40_000].join(" + "));
        // Thousands of items in one file are not a chain.
        let many: String = (0..5000)
            .map(|i| format!("fn f{i}(a: i32) -> i32 {{ a }}\n"))
            .collect();
        let mut out = Vec::new();
        scan_source(&format!("{kernel}{many}"), &mut out);
        assert_eq!(out.len(), 1);
        for src in [deep, long] {
            let dir = tempfile::tempdir().expect("tempdir");
            std::fs::write(dir.path().join("lib.rs"), src).expect("write");
            let mut out = Vec::new();
            scan_path(dir.path(), &mut out).expect("scan");
            assert!(out.is_empty());
        }
    }

    #[cfg(unix)]
    #[test]
    fn link_loops_and_fifos_do_not_hang_the_scan() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("k.rs"),
            "#[harl::kernel]\nfn neg(x: Tensor<f32, 4>) -> Tensor<f32, 4> { -x }\n",
        )
        .expect("write");
        std::os::unix::fs::symlink(dir.path(), dir.path().join("loop")).expect("symlink");
        let fifo = dir.path().join("pipe.rs");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo")
            .success());
        let mut out = Vec::new();
        scan_path(dir.path(), &mut out).expect("scan");
        let names: Vec<&str> = out.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["neg"]);
    }
}
