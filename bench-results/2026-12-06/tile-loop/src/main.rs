//! A hand-written copy of the GEMM loop harl emits for BERT's FFN layer (rows of A broadcast,
//! 32-wide weight panels, reduction in blocks of `kc`), to try tile shapes, software prefetch
//! and buffer alignment outside harl. Not part of the workspace; run:
//!   cargo run --release --manifest-path bench-results/2026-12-06/tile-loop/Cargo.toml -- ROWS KC PREFETCH PANELS_PER_TASK [OFFSET_BYTES]
//! ROWS: 8, 10, 12, 6, 4, or 84 (8 x 48) and 64 (6 x 64). Prints median and best GFLOP/s of 100 runs.
use std::arch::x86_64::*;
use std::time::Instant;
const M: usize = 120; const K: usize = 768; const N: usize = 3072;

// C[M,N] += A[M,K] * P (panels of 32 columns: [N/32][K][32]); rows in tiles of MR, K in chunks of KC.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn gemm<const MR: usize, const PF: bool, const NV: usize>(a: *const f32, p: *const f32, c: *mut f32, kc: usize, rows: std::ops::Range<usize>, cols: std::ops::Range<usize>) {
    for k0 in (0..K).step_by(kc) { for n1 in cols.clone() { let mut m = rows.start; while m + MR <= rows.end {
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        let w = NV * 16;
        let pp = p.add(n1 * (K * w));
        for kk in k0..k0 + kc {
            let mut b = [_mm512_setzero_ps(); NV];
            for v in 0..NV { b[v] = _mm512_loadu_ps(pp.add(kk * w + 16 * v)); }
            if PF { _mm_prefetch::<_MM_HINT_T0>(pp.add((kk + 8) * w) as *const i8); }
            for r in 0..MR {
                let av = _mm512_set1_ps(*a.add((m + r) * K + kk));
                for v in 0..NV { acc[r][v] = _mm512_fmadd_ps(av, b[v], acc[r][v]); }
            }
        }
        for r in 0..MR { for h in 0..NV {
            let cp = c.add((m + r) * N + n1 * w + h * 16);
            _mm512_storeu_ps(cp, _mm512_add_ps(_mm512_loadu_ps(cp), acc[r][h]));
        }}
        m += MR;
    }}}
}

/// A buffer of `len` floats and the index where they start: `off` bytes past a cache line.
fn buf(len: usize, off: usize) -> (Vec<f32>, usize) {
    let v = vec![1.0f32; len + 64];
    let base = v.as_ptr() as usize;
    let start = (((base + 63) & !63) - base) / 4 + off / 4;
    (v, start)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mr, kc, pf, nb): (usize, usize, bool, usize) = (args[0].parse().unwrap(), args[1].parse().unwrap(), args[2] == "1", args[3].parse().unwrap());
    // Optional 5th argument: every buffer this many bytes past a cache line (16: where a large Vec lands).
    let off: usize = args.get(4).map_or(0, |s| s.parse().unwrap());
    let (a, ia) = buf(M * K, off); let (p, ip) = buf(K * N, off); let (mut c, ic) = buf(M * N, off);
    let flops = 2.0 * (M * N * K) as f64;
    let mut t = Vec::new();
    for _ in 0..100 {
        let s = Instant::now();
        // tasks: column blocks of nb panels
        for cb in (0..N / 32).step_by(nb) { unsafe {
            let (ap, pp, cp) = (a.as_ptr().add(ia), p.as_ptr().add(ip), c.as_mut_ptr().add(ic));
            let cols = cb..cb + nb;
            match (mr, pf) {
                (84, false) => gemm::<8, false, 3>(ap, pp, cp, kc, 0..M, cb * 32 / 48..(cb + nb) * 32 / 48),
                (64, false) => gemm::<6, false, 4>(ap, pp, cp, kc, 0..M, cb / 2..(cb + nb) / 2),
                (8, false) => gemm::<8, false, 2>(ap, pp, cp, kc, 0..M, cols),
                (8, true) => gemm::<8, true, 2>(ap, pp, cp, kc, 0..M, cols),
                (10, false) => gemm::<10, false, 2>(ap, pp, cp, kc, 0..M, cols),
                (12, false) => gemm::<12, false, 2>(ap, pp, cp, kc, 0..M, cols),
                (12, true) => gemm::<12, true, 2>(ap, pp, cp, kc, 0..M, cols),
                (6, false) => gemm::<6, false, 2>(ap, pp, cp, kc, 0..M, cols),
                (4, false) => gemm::<4, false, 2>(ap, pp, cp, kc, 0..M, cols),
                _ => panic!(),
            }
        }}
        t.push(s.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    println!("mr={mr} kc={kc} pf={pf} nb={nb} offset={off}: median {:.1} GFLOP/s, best {:.1}", flops / t[50] / 1e9, flops / t[0] / 1e9);
}
