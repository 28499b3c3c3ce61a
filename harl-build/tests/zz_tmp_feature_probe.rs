// Temporary probe (features over the sketch space); deleted after use.
use harl_build::default_schedule::CpuTarget;
use harl_build::lower::lower;
use harl_build::tune::features::{extract, FEATURE_LEN, FEATURE_NAMES};
use harl_build::tune::rng::Rng;
use harl_build::tune::sketch::generate_sketches;
use harl_te::ops::workloads as w;

#[test]
fn probe() {
    let graphs = vec![
        ("matmul", w::matmul(128, 256, 192).unwrap()),
        ("dense_bias_relu", w::dense_bias_relu(64, 128, 96).unwrap()),
        ("conv2d", w::conv2d(1, 16, 28, 28, 32, 3, 3, 1, 1, 1, 1).unwrap()),
        ("dwconv", w::depthwise_conv2d(1, 32, 28, 28, 3, 3, 1, 1).unwrap()),
        ("softmax", w::softmax(64, 1000).unwrap()),
        ("layer_norm", w::layer_norm(64, 768).unwrap()),
        ("bmm", w::batch_matmul(4, 64, 64, 64).unwrap()),
    ];
    let target = CpuTarget::portable();
    let mut rng = Rng::new(1);
    let mut nonzero = vec![0usize; FEATURE_LEN];
    let mut total = 0;
    for (name, g) in &graphs {
        let sketches = generate_sketches(g, &target);
        let (mut progs, mut feats) = (Vec::new(), Vec::new());
        let mut n = 0;
        let t0 = std::time::Instant::now();
        for _ in 0..200 {
            let i = rng.below(sketches.len());
            let p = sketches[i].sample(i, &mut rng);
            let s = sketches[i].to_schedule(&p).unwrap();
            let prog = lower(g, &s).unwrap();
            let v = extract(&prog);
            assert_eq!(v.len(), FEATURE_LEN);
            assert!(v.iter().all(|x| x.is_finite()), "{name}");
            for (k, x) in v.iter().enumerate() { if *x != 0.0 { nonzero[k] += 1; } }
            n += 1; total += 1;
            if !progs.contains(&prog.nests) { progs.push(prog.nests.clone()); }
            if !feats.contains(&v) { feats.push(v); }
        }
        println!("{name}: {} sketches, {n} samples, {} distinct programs, {} distinct feature vectors, {:?}", sketches.len(), progs.len(), feats.len(), t0.elapsed());
    }
    let never: Vec<_> = FEATURE_NAMES.iter().zip(&nonzero).filter(|(_, c)| **c == 0).map(|(n, _)| *n).collect();
    println!("{} of {} features never nonzero in {total}: {never:?}", never.len(), FEATURE_LEN);
}
