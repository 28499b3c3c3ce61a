#![allow(clippy::all)]
harl::include_kernels!();

fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n).map(|_| { x ^= x << 13; x ^= x >> 7; x ^= x << 17; ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0 }).collect()
}

fn time(mut call: impl FnMut()) -> f64 {
    call();
    call();
    let start = std::time::Instant::now();
    let mut t = Vec::new();
    while t.len() < 10 || start.elapsed().as_secs_f64() < 0.5 {
        let c = std::time::Instant::now();
        call();
        t.push(c.elapsed().as_secs_f64());
    }
    t.sort_by(|a, b| a.total_cmp(b));
    t[t.len() / 2]
}

fn main() {
    let threads: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).expect("threads");
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
    pool.install(|| {
        {
            let x0 = data(98304, 1);
            let x1 = data(2359296, 2);
            let x2 = data(3072, 3);
            let mut out = vec![0f32; 393216];
            let p = bert_ffn_up_gelu::prepare(&x1, &x2).expect("lengths");
            let t = time(|| { p.run(&x0, &mut out).expect("lengths"); });
            println!("TIME bert_ffn_up_gelu {t:e} {}", bert_ffn_up_gelu::schedule_source());
        }
        {
            let x0 = data(196608, 17);
            let mut out = vec![0f32; 196608];
            let t = time(|| { bert_softmax::run(&x0, &mut out).expect("lengths"); });
            println!("TIME bert_softmax {t:e} {}", bert_softmax::schedule_source());
        }
        {
            let x0 = data(200704, 33);
            let x1 = data(36864, 34);
            let x2 = data(64, 35);
            let mut out = vec![0f32; 200704];
            let p = resnet_s1_3x3_64::prepare(&x1, &x2).expect("lengths");
            let t = time(|| { p.run(&x0, &mut out).expect("lengths"); });
            println!("TIME resnet_s1_3x3_64 {t:e} {}", resnet_s1_3x3_64::schedule_source());
        }
        {
            let x0 = data(25088, 49);
            let x1 = data(1048576, 50);
            let x2 = data(2048, 51);
            let x3 = data(100352, 52);
            let mut out = vec![0f32; 100352];
            let p = resnet_s4_1x1_2048_residual::prepare(&x1, &x2).expect("lengths");
            let t = time(|| { p.run(&x0, &x3, &mut out).expect("lengths"); });
            println!("TIME resnet_s4_1x1_2048_residual {t:e} {}", resnet_s4_1x1_2048_residual::schedule_source());
        }
        {
            let x0 = data(451584, 65);
            let x1 = data(1296, 66);
            let x2 = data(144, 67);
            let mut out = vec![0f32; 451584];
            let p = mbv2_dw_56_s1::prepare(&x1, &x2).expect("lengths");
            let t = time(|| { p.run(&x0, &mut out).expect("lengths"); });
            println!("TIME mbv2_dw_56_s1 {t:e} {}", mbv2_dw_56_s1::schedule_source());
        }
        {
            let x0 = data(4096, 81);
            let x1 = data(16777216, 82);
            let mut out = vec![0f32; 4096];
            let p = gemv_4096x4096::prepare(&x1).expect("lengths");
            let t = time(|| { p.run(&x0, &mut out).expect("lengths"); });
            println!("TIME gemv_4096x4096 {t:e} {}", gemv_4096x4096::schedule_source());
        }
    });
}
