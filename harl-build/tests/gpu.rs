//! GPU schedules: every sampled GPU schedule computes what the interpreter computes (run by the
//! loop-IR executor, bound loops serial), emits CUDA C, and, where NVRTC and ptxas are
//! installed (CI installs the pip wheels), compiles to PTX that ptxas accepts for sm_90 and
//! sm_80.

mod common;

use common::{assert_close, data, f64_math};
use harl_build::cuda;
use harl_build::gpu_sketch::GpuSketch;
use harl_build::loop_ir::execute;
use harl_build::lower::lower;
use harl_build::rng::Rng;
use harl_te::ops::workloads as w;
use harl_te::{interp, Graph};
use proptest::prelude::*;

fn cases() -> Vec<(&'static str, Graph)> {
    vec![
        ("matmul 7x13x9", w::matmul(7, 13, 9).expect("matmul")),
        ("matmul 3x56x257", w::matmul(3, 56, 257).expect("matmul")),
        (
            "dense_bias_relu",
            w::dense_bias_relu(6, 10, 32).expect("dense"),
        ),
        (
            "conv2d pad 1 stride 2",
            w::conv2d(1, 3, 7, 6, 4, 3, 3, 2, 1, 1, 1).expect("conv2d"),
        ),
        (
            "depthwise",
            w::depthwise_conv2d(1, 4, 7, 7, 3, 3, 1, 1, 1).expect("depthwise"),
        ),
        (
            // Stride 2: the padded input split into its phases (a 5-D stage).
            "depthwise stride 2",
            w::depthwise_conv2d(1, 4, 9, 9, 3, 3, 2, 1, 1).expect("depthwise"),
        ),
        ("softmax", w::softmax(3, 48).expect("softmax")),
        ("layer_norm", w::layer_norm(4, 48).expect("layer_norm")),
        ("batch_matmul", w::batch_matmul(2, 5, 7, 12).expect("bmm")),
        (
            "conv2d_transpose",
            w::conv2d_transpose(1, 3, 3, 3, 2, 4, 4, 2, 1, 1).expect("conv2d_transpose"),
        ),
        ("f64 math", f64_math()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    #[test]
    fn gpu_schedules_match_the_interpreter(seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        for (name, g) in cases() {
            let sk = GpuSketch::new(&g).expect("sketch");
            let p = sk.sample(&mut rng);
            let s = sk.to_schedule(&p).expect("valid by construction");
            let program = lower(&g, &s).expect("lowers");
            let inputs = data(&g, 5);
            let refs: Vec<&[f64]> = inputs.iter().map(|v| v.as_slice()).collect();
            let want = interp::run(&g, &refs).expect("interpreter");
            let got = execute(&program, &refs).expect("execute");
            assert_close(&got, &want, 1e-4, &format!("{name}: {p:?}"));
            let m = cuda::emit(&program).expect("emits CUDA");
            prop_assert!(m.launches.iter().all(|l| l.block <= 1024 && l.grid >= 1));
            prop_assert!(m.source.matches("__global__").count() == m.launches.len());
        }
    }
}

/// NVRTC and ptxas on random schedules of the suite's GEMM and conv2d (real sizes).
#[cfg(feature = "cuda")]
#[test]
fn random_gpu_schedules_compile_to_ptx_that_ptxas_accepts() {
    use harl_build::nvrtc;
    let required = std::env::var_os("HARL_REQUIRE_CUDA_TOOLS").is_some_and(|v| v == "1");
    let skip = |why: &str| {
        assert!(!required, "HARL_REQUIRE_CUDA_TOOLS=1 but {why}");
        eprintln!("skipped: {why}");
    };
    if !nvrtc::nvrtc_available() {
        return skip("NVRTC is not installed");
    }
    let Some(ptxas) = nvrtc::find_ptxas() else {
        return skip("ptxas is not installed");
    };
    let work = std::env::temp_dir().join("harl-ptxas-test");
    let mut rng = Rng::new(11);
    let graphs = [
        ("gemm 1024", w::matmul(1024, 1024, 1024).expect("mm")),
        (
            "conv2d 56",
            w::conv2d(1, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1).expect("conv2d"),
        ),
        (
            "dense_bias_relu",
            w::dense_bias_relu(64, 128, 96).expect("dense"),
        ),
        // Little spatial parallelism: the default is a cross-thread reduction.
        ("softmax 128x768", w::softmax(128, 768).expect("softmax")),
        ("gemv 4096->64", w::matmul(1, 4096, 64).expect("gemv")),
    ];
    for (name, g) in graphs {
        let sk = GpuSketch::new(&g).expect("sketch");
        let params: Vec<_> = std::iter::once(sk.default_params())
            .chain((0..3).map(|_| sk.sample(&mut rng)))
            .collect();
        for p in params {
            let program = lower(&g, &sk.to_schedule(&p).expect("valid")).expect("lowers");
            let m = cuda::emit(&program).expect("emits");
            for cc in [90, 80] {
                let ptx = nvrtc::compile_ptx(&m.source, cc)
                    .unwrap_or_else(|e| panic!("{name} {p:?}: {e}\n{}", m.source));
                assert!(
                    ptx.contains(".entry harl_nest"),
                    "{name}: no kernel in the PTX"
                );
                nvrtc::check_ptx(&ptxas, &ptx, cc, &work)
                    .unwrap_or_else(|e| panic!("{name} {p:?}: {e}"));
            }
        }
    }
}

/// A missing NVRTC is an error value, not a panic.
#[cfg(feature = "cuda")]
#[test]
fn bad_cuda_source_is_a_typed_error() {
    use harl_build::nvrtc::{compile_ptx, NvrtcError};
    match compile_ptx("this is not CUDA", 80) {
        Err(NvrtcError::Compile(log)) => assert!(!log.is_empty()),
        Err(NvrtcError::NoNvrtc) => eprintln!("skipped: NVRTC is not installed"),
        other => panic!("expected an error, got {other:?}"),
    }
}

/// Prints one kernel (run with `--nocapture` to read it).
#[test]
fn print_one_gemm_kernel() {
    let g = w::matmul(256, 256, 256).expect("mm");
    let sk = GpuSketch::new(&g).expect("sketch");
    let p = sk.sample(&mut Rng::new(2));
    let program = lower(&g, &sk.to_schedule(&p).expect("valid")).expect("lowers");
    let m = cuda::emit(&program).expect("emits");
    eprintln!("{p:?}\n{:?}\n{}", m.launches, m.source);
    assert_eq!(
        m.launches.last().map(|l| l.name.as_str()),
        Some("harl_nest0")
    );
}
