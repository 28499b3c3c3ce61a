//! Finds `#[harl::kernel]` items in a crate's sources.
//!
//! Items that fail to parse are skipped here: the attribute macro reports them with a span
//! when the crate compiles, which is the better place for the error.

use harl_te::dsl::{is_kernel_attr, parse_kernel, KernelDecl};
use std::path::{Path, PathBuf};

/// Appends the kernels declared under `path` (a file or a directory, recursively) to `out`.
pub fn scan_path(path: &Path, out: &mut Vec<KernelDecl>) -> Result<(), (PathBuf, std::io::Error)> {
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| (path.to_path_buf(), e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for p in entries {
            scan_path(&p, out)?;
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        let src = std::fs::read_to_string(path).map_err(|e| (path.to_path_buf(), e))?;
        scan_source(&src, out);
    }
    Ok(())
}

/// Appends the kernels declared in one source file.
pub fn scan_source(src: &str, out: &mut Vec<KernelDecl>) {
    if let Ok(file) = syn::parse_file(src) {
        scan_items(&file.items, out);
    }
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
}
