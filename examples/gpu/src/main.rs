//! harl on a GPU: one kernel, run on the GPU when there is one, on the CPU otherwise.

/// A dense layer: relu(a x w + bias).
#[harl::kernel(M = 256, K = 512, N = 256)]
fn dense_relu(
    a: Tensor<f32, M, K>,
    w: Tensor<f32, K, N>,
    bias: Tensor<f32, N>,
) -> Tensor<f32, M, N> {
    let mm = compute([M, N], |i, j| sum(K, |k| a[[i, k]] * w[[k, j]]));
    compute([M, N], |i, j| max(mm[[i, j]] + bias[j], 0.0))
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

fn main() {
    let (m, k, n) = (256, 512, 256);
    let (a, w, bias) = (data(m * k, 1), data(k * n, 2), data(n, 3));
    let mut cpu = vec![0.0; m * n];
    dense_relu(&a, &w, &bias, &mut cpu).expect("buffer lengths match the declared shapes");
    println!(
        "dense_relu [{m}x{k}] x [{k}x{n}] + bias, relu: CPU done ({})",
        dense_relu::schedule_source()
    );

    let gpu = match harl::gpu::Gpu::new(0) {
        Ok(gpu) => gpu,
        Err(e) => {
            println!("GPU: not run ({e}); the CPU result above stands");
            return;
        }
    };
    let run = dense_relu::GPU.load(&gpu).and_then(|kernel| {
        let mut out = vec![0.0; m * n];
        kernel.run_host(&[&a, &w, &bias], &mut out)?;
        Ok((out, kernel.is_tuned()))
    });
    match run {
        Ok((out, tuned)) => {
            let worst = out
                .iter()
                .zip(&cpu)
                .map(|(g, c)| (g - c).abs() / (1.0 + c.abs()))
                .fold(0.0f32, f32::max);
            let ok = worst <= 1e-6 * k as f32;
            println!(
                "GPU ({} schedule): max relative difference from the CPU {worst:.2e} -> {}",
                if tuned { "tuned" } else { "default" },
                if ok { "ok" } else { "MISMATCH" }
            );
            if !ok {
                std::process::exit(1);
            }
        }
        Err(e) => {
            println!("GPU: could not run ({e}); the CPU result above stands");
        }
    }
}
