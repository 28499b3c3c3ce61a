//! CUDA C to PTX with NVRTC (through cudarc, loaded at run time), and a check of PTX with
//! `ptxas` where one is installed.
//!
//! Nothing here touches a GPU. Both tools are optional on a build host: a missing NVRTC library
//! or `ptxas` is a typed error the caller can report or skip on, never a panic.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Why CUDA C could not be turned into checked PTX.
#[derive(Debug, thiserror::Error)]
pub enum NvrtcError {
    /// libnvrtc could not be loaded (no CUDA toolkit, and no nvidia-cuda-nvrtc-cu12 wheel on
    /// `LD_LIBRARY_PATH`).
    #[error("NVRTC is not installed (libnvrtc not found on the library path)")]
    NoNvrtc,
    /// NVRTC rejected the source: its log.
    #[error("NVRTC failed: {0}")]
    Compile(String),
    /// No `ptxas` was found (`HARL_PTXAS`, then `PATH`).
    #[error("ptxas not found (set HARL_PTXAS or put ptxas on PATH)")]
    NoPtxas,
    /// `ptxas` rejected the PTX: its output.
    #[error("ptxas rejected the PTX for {arch}: {log}")]
    Ptxas {
        /// The architecture, e.g. `sm_90`.
        arch: String,
        /// What ptxas printed.
        log: String,
    },
    /// Running ptxas or writing its input failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Whether libnvrtc can be loaded.
pub fn nvrtc_available() -> bool {
    // SAFETY: `is_culib_present` only tries to dlopen the library by its usual names and
    // drops the handle; it has no other precondition.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles `source` to PTX for the virtual architecture `compute_<cc>` (e.g. `cc = 90`).
pub fn compile_ptx(source: &str, cc: u32) -> Result<String, NvrtcError> {
    if !nvrtc_available() {
        return Err(NvrtcError::NoNvrtc);
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{cc}")],
        ..Default::default()
    };
    match cudarc::nvrtc::compile_ptx_with_opts(source, opts) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(e) => Err(NvrtcError::Compile(format!("{e:?}"))),
    }
}

/// The `ptxas` to use: `HARL_PTXAS` if set, else the first on `PATH`.
pub fn find_ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HARL_PTXAS") {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("ptxas"))
        .find(|p| p.is_file())
}

/// Assembles `ptx` with `ptxas -arch=sm_<cc>` (the output is discarded): proof that the PTX
/// is valid for that GPU generation, including its register and shared-memory limits.
pub fn check_ptx(ptxas: &Path, ptx: &str, cc: u32, work_dir: &Path) -> Result<(), NvrtcError> {
    std::fs::create_dir_all(work_dir)?;
    let input = work_dir.join(format!("check-{}-{cc}.ptx", std::process::id()));
    std::fs::write(&input, ptx)?;
    let out = Command::new(ptxas)
        .arg(format!("-arch=sm_{cc}"))
        .arg(&input)
        .arg("-o")
        .arg(work_dir.join(format!("check-{}-{cc}.cubin", std::process::id())))
        .output()?;
    let _ = std::fs::remove_file(&input);
    if out.status.success() {
        Ok(())
    } else {
        Err(NvrtcError::Ptxas {
            arch: format!("sm_{cc}"),
            log: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        })
    }
}
