//! f32 `exp`, `ln`, `tanh` and `erf` that vectorise: branch-free (every special case is a
//! select), no calls, no tables, `mul_add` only when the caller's `FMA` parameter says the CPU
//! has the instruction (elsewhere it is a libm call; the kernels pass their variant's), all
//! `#[inline]` so that LLVM inlines them into a kernel's loop under its `#[target_feature]` and
//! turns the loop into AVX-512 / AVX2 / NEON code. The scalar `f32::exp` and friends are calls
//! into libm that stop a loop from vectorising; a GELU epilogue spent most of its time in them.
//!
//! Error bounds, against the correctly rounded result of an f64 reference (std's `exp`, `ln`,
//! `tanh`; the `libm` crate's `erf`) over a dense sweep of f32 inputs (the tests below: every
//! 509th f32 over the whole range plus every 3rd to 11th around the hard spots; 16x sparser
//! in debug builds), with and without FMA: asserted at most 2 ulp for `exp_f32` (normal
//! results; subnormal ones within 2^-148), `ln_f32` and `tanh_f32`, and 4 ulp for `erf_f32`;
//! the worst seen in a release sweep was 1, 1, 1 and 3 ulp without FMA and 1, 1, 2 and 3 with
//! it. Special values follow IEEE: NaN in, NaN out;
//! `exp(+inf) = inf`, `exp(-inf) = 0`; `ln(0) = -inf`, `ln(x < 0) = NaN`, `ln(inf) = inf`;
//! `tanh(±inf) = ±1`; `erf(±inf) = ±1`.
//!
//! Kernels call these in their AVX-512, AVX2 and aarch64 variants; on x86 without AVX2 the
//! code runs scalar and libm is faster, so that variant keeps libm.

use super::madd_f32 as madd;

const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in two: `LN2_HI` has trailing zero bits, so `n * LN2_HI` is exact for the `n`
/// that occur (|n| < 2^8).
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;
/// 1.5 * 2^23: adding and subtracting it rounds to the nearest integer (ties to even).
const ROUND: f32 = 12_582_912.0;

/// exp's argument is clamped to these: beyond them the result is inf or 0 anyway, and 2^n's
/// exponent stays in range.
const EXP_MIN_ARG: f32 = -104.0;
const EXP_MAX_ARG: f32 = 89.0;

/// e^r on |r| <= ln2/2: the Taylor polynomial to degree 7 (truncation < 2^-27 relative), the
/// highest coefficient first (Horner's order).
const EXP_TAYLOR: [f32; 8] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

#[cfg(target_arch = "x86")]
use core::arch::x86 as arch;
#[cfg(target_arch = "x86_64")]
use core::arch::x86_64 as arch;

/// 2^k for `k` in [-126, 127], built from its bits.
#[inline(always)]
fn pow2i(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// `e^x` (at most 2 ulp). `FMA`: the polynomial and the range reduction as fused
/// multiply-adds (1.5x faster on AVX-512; pass the variant's `FMA`, false where there is no
/// FMA unit, as `mul_add` is then a libm call).
#[inline(always)]
pub fn exp_f32<const FMA: bool>(x: f32) -> f32 {
    let xc = x.clamp(EXP_MIN_ARG, EXP_MAX_ARG);
    // n = round(x / ln 2), as a float and, from the same sum's low bits, as an integer: no
    // float-to-int conversion (Rust's saturating `as` does not vectorise well).
    let t = madd::<FMA>(xc, LOG2_E, ROUND);
    let n = t - ROUND;
    let ni = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let r = madd::<FMA>(-n, LN2_LO, madd::<FMA>(-n, LN2_HI, xc));
    let mut p = EXP_TAYLOR[0];
    for c in &EXP_TAYLOR[1..] {
        p = madd::<FMA>(r, p, *c);
    }
    // 2^n in two halves, so that n in [-150, 129] never leaves the exponent's range: the
    // product overflows to inf or rounds to a subnormal or 0 as the true result does.
    let n1 = ni >> 1;
    let y = p * pow2i(n1) * pow2i(ni - n1);
    if x.is_nan() {
        x
    } else {
        y
    }
}

/// [`exp_f32::<true>`] over the 8 lanes of an AVX2 vector, bit for bit: the same operations
/// on every lane, and, where every lane's result is a normal number (the usual case), 2^n
/// added to the polynomial's exponent in one integer add instead of the two multiplies that
/// keep subnormal and overflowing results right (taken for the whole vector otherwise). The
/// clamp passes NaN through (`max` and `min` return their second operand when one is NaN),
/// so no final select is needed. For the AVX2 variant's explicit vector loops, which
/// otherwise left exp to a scalar loop for the compiler to vectorise (BERT's softmax on a Zen
/// 3: 215 us with that loop, 169 us with this).
///
/// # Safety
/// The CPU must have AVX2 and FMA (the caller's `#[target_feature]`, or detection).
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn exp_f32x8(x: arch::__m256) -> arch::__m256 {
    use arch::*;
    let xc = _mm256_min_ps(
        _mm256_set1_ps(EXP_MAX_ARG),
        _mm256_max_ps(_mm256_set1_ps(EXP_MIN_ARG), x),
    );
    let round = _mm256_set1_ps(ROUND);
    let t = _mm256_fmadd_ps(xc, _mm256_set1_ps(LOG2_E), round);
    let n = _mm256_sub_ps(t, round);
    let ni = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(round));
    let r = _mm256_fnmadd_ps(
        n,
        _mm256_set1_ps(LN2_LO),
        _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), xc),
    );
    let mut p = _mm256_set1_ps(EXP_TAYLOR[0]);
    for c in &EXP_TAYLOR[1..] {
        p = _mm256_fmadd_ps(r, p, _mm256_set1_ps(*c));
    }
    // p is in [0.70, 1.42]: p * 2^n is normal for n in [-125, 126]. A NaN's n is far outside.
    let outside = _mm256_or_si256(
        _mm256_cmpgt_epi32(ni, _mm256_set1_epi32(126)),
        _mm256_cmpgt_epi32(_mm256_set1_epi32(-125), ni),
    );
    if _mm256_testz_si256(outside, outside) != 0 {
        let scaled = _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32::<23>(ni));
        return _mm256_castsi256_ps(scaled);
    }
    let n1 = _mm256_srai_epi32::<1>(ni);
    let bias = _mm256_set1_epi32(127);
    let pow2 = |k: __m256i| _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(k, bias)));
    _mm256_mul_ps(_mm256_mul_ps(p, pow2(n1)), pow2(_mm256_sub_epi32(ni, n1)))
}

/// [`exp_f32::<true>`] over the 16 lanes of an AVX-512 vector, bit for bit: [`exp_f32x8`]'s
/// operations on 512-bit vectors. For the AVX-512 variant's explicit vector loops, which
/// otherwise stored the lanes, ran the scalar function over them in a loop for the compiler to
/// vectorise and loaded them back.
///
/// # Safety
/// The CPU must have AVX-512F (the caller's `#[target_feature]`, or detection).
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
#[inline]
#[target_feature(enable = "avx512f")]
pub fn exp_f32x16(x: arch::__m512) -> arch::__m512 {
    use arch::*;
    let xc = _mm512_min_ps(
        _mm512_set1_ps(EXP_MAX_ARG),
        _mm512_max_ps(_mm512_set1_ps(EXP_MIN_ARG), x),
    );
    let round = _mm512_set1_ps(ROUND);
    let t = _mm512_fmadd_ps(xc, _mm512_set1_ps(LOG2_E), round);
    let n = _mm512_sub_ps(t, round);
    let ni = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_castps_si512(round));
    let r = _mm512_fnmadd_ps(
        n,
        _mm512_set1_ps(LN2_LO),
        _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), xc),
    );
    let mut p = _mm512_set1_ps(EXP_TAYLOR[0]);
    for c in &EXP_TAYLOR[1..] {
        p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(*c));
    }
    // As in `exp_f32x8`: one integer add where every lane's result is normal.
    let outside = _mm512_cmpgt_epi32_mask(ni, _mm512_set1_epi32(126))
        | _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(-125), ni);
    if outside == 0 {
        let scaled = _mm512_add_epi32(_mm512_castps_si512(p), _mm512_slli_epi32::<23>(ni));
        return _mm512_castsi512_ps(scaled);
    }
    let n1 = _mm512_srai_epi32::<1>(ni);
    let bias = _mm512_set1_epi32(127);
    let pow2 = |k: __m512i| _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(k, bias)));
    _mm512_mul_ps(_mm512_mul_ps(p, pow2(n1)), pow2(_mm512_sub_epi32(ni, n1)))
}

/// The natural logarithm (at most 2 ulp); `FMA` as for [`exp_f32`].
#[inline(always)]
pub fn ln_f32<const FMA: bool>(x: f32) -> f32 {
    // Subnormals: scale into the normal range first.
    let tiny = x < f32::MIN_POSITIVE;
    let xs = if tiny { x * 8_388_608.0 } else { x };
    let bits = xs.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 127 - if tiny { 23 } else { 0 };
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    // m in [sqrt(2)/2, sqrt(2)), so that ln(m) is small and centred.
    let big = m > std::f32::consts::SQRT_2;
    m = if big { m * 0.5 } else { m };
    e += i32::from(big);
    let f = m - 1.0;
    // ln(1 + f) = 2 atanh(s) with s = f / (2 + f), |s| <= 0.1716, written as fdlibm does:
    // f - f^2/2 + s (f^2/2 + R), so the exact f carries the result and rounding only touches
    // the small corrections.
    let s = f / (2.0 + f);
    let z = s * s;
    let r = z * madd::<FMA>(
        z,
        madd::<FMA>(z, madd::<FMA>(z, 2.0 / 9.0, 2.0 / 7.0), 2.0 / 5.0),
        2.0 / 3.0,
    );
    let hfsq = 0.5 * f * f;
    let ef = e as f32;
    let y = ef * LN2_HI - ((hfsq - (s * (hfsq + r) + ef * LN2_LO)) - f);
    let y = if x == 0.0 { f32::NEG_INFINITY } else { y };
    let y = if x == f32::INFINITY { x } else { y };
    if x < 0.0 || x.is_nan() {
        f32::NAN
    } else {
        y
    }
}

/// The hyperbolic tangent (at most 2 ulp); `FMA` as for [`exp_f32`].
#[inline(always)]
pub fn tanh_f32<const FMA: bool>(x: f32) -> f32 {
    let a = x.abs();
    // Small |x|: the odd Taylor series to x^19 (|x| < 0.55: truncation < 2^-30 relative).
    let a2 = a * a;
    let mut p = -443_861_162.0 / 1_856_156_927_625.0;
    for c in [
        6_404_582.0 / 10_854_718_875.0,
        -929_569.0 / 638_512_875.0,
        21_844.0 / 6_081_075.0,
        -1382.0 / 155_925.0,
        62.0 / 2835.0,
        -17.0 / 315.0,
        2.0 / 15.0,
        -1.0 / 3.0,
        1.0,
    ] {
        p = madd::<FMA>(a2, p, c);
    }
    let small = a * p;
    // Elsewhere 1 - 2 / (e^(2|x|) + 1); e^(2|x|) is inf past 44, which gives exactly 1.
    let large = 1.0 - 2.0 / (exp_f32::<FMA>(2.0 * a) + 1.0);
    let t = if a < 0.55 { small } else { large };
    let t = if x.is_nan() { x } else { t };
    t.copysign(x)
}

/// erf on |x| < 0.6: 2/sqrt(pi) * sum (-1)^k x^(2k+1) / (k! (2k+1)), to k = 8, the highest
/// coefficient first (Horner's order, in x^2).
const ERF_SMALL: [f32; 9] = [
    1.0 / 685_440.0,
    -1.0 / 75_600.0,
    1.0 / 9360.0,
    -1.0 / 1320.0,
    1.0 / 216.0,
    -1.0 / 42.0,
    1.0 / 10.0,
    -1.0 / 3.0,
    1.0,
];
/// erfc's Chebyshev fit (relative error < 1.2e-7; Numerical Recipes' erfcc), in
/// t = 1 / (1 + |x| / 2), the highest coefficient first; then `ERFC_LAST`.
const ERFC_FIT: [f32; 9] = [
    0.170_872_77,
    -0.822_152_23,
    1.488_515_9,
    -1.135_204,
    0.278_868_07,
    -0.186_288_06,
    0.096_784_18,
    0.374_091_96,
    1.000_023_7,
];
const ERFC_LAST: f32 = 1.265_512_2;

/// The error function (at most 4 ulp); `FMA` as for [`exp_f32`].
#[inline(always)]
pub fn erf_f32<const FMA: bool>(x: f32) -> f32 {
    let z = x.abs().min(4.0);
    let z2 = z * z;
    let mut p = ERF_SMALL[0];
    for c in &ERF_SMALL[1..] {
        p = madd::<FMA>(z2, p, *c);
    }
    let small = z * (std::f32::consts::FRAC_2_SQRT_PI * p);
    // Elsewhere 1 - erfc(|x|). At |x| >= 4 erfc < 2^-26, below half an ulp of 1.
    let t = 1.0 / (1.0 + 0.5 * z);
    let mut q = ERFC_FIT[0];
    for c in &ERFC_FIT[1..] {
        q = madd::<FMA>(t, q, *c);
    }
    let erfc = t * exp_f32::<FMA>(madd::<FMA>(t, q, -z2 - ERFC_LAST));
    let e = if z < 0.6 { small } else { 1.0 - erfc };
    let e = if x.is_nan() { x } else { e };
    e.copysign(x)
}

/// [`erf_f32::<true>`] over the 16 lanes of an AVX-512 vector, bit for bit (its operations in
/// its order, both sides of its selects computed). For the AVX-512 variant's explicit vector
/// loops: GELU's write-back in BERT's FFN stored the lanes, ran the scalar function over them
/// and loaded them back.
///
/// # Safety
/// The CPU must have AVX-512F (the caller's `#[target_feature]`, or detection).
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
#[inline]
#[target_feature(enable = "avx512f")]
pub fn erf_f32x16(x: arch::__m512) -> arch::__m512 {
    use arch::*;
    let sign = _mm512_set1_epi32(i32::MIN);
    let bits = _mm512_castps_si512(x);
    let abs = _mm512_castsi512_ps(_mm512_andnot_si512(sign, bits));
    // As `f32::min`: a NaN lane gives 4 (the NaN is put back below).
    let z = _mm512_min_ps(abs, _mm512_set1_ps(4.0));
    let z2 = _mm512_mul_ps(z, z);
    let mut p = _mm512_set1_ps(ERF_SMALL[0]);
    for c in &ERF_SMALL[1..] {
        p = _mm512_fmadd_ps(z2, p, _mm512_set1_ps(*c));
    }
    let small = _mm512_mul_ps(
        z,
        _mm512_mul_ps(_mm512_set1_ps(std::f32::consts::FRAC_2_SQRT_PI), p),
    );
    let one = _mm512_set1_ps(1.0);
    let t = _mm512_div_ps(
        one,
        _mm512_add_ps(one, _mm512_mul_ps(_mm512_set1_ps(0.5), z)),
    );
    let mut q = _mm512_set1_ps(ERFC_FIT[0]);
    for c in &ERFC_FIT[1..] {
        q = _mm512_fmadd_ps(t, q, _mm512_set1_ps(*c));
    }
    let arg = _mm512_sub_ps(
        _mm512_sub_ps(_mm512_setzero_ps(), z2),
        _mm512_set1_ps(ERFC_LAST),
    );
    let erfc = _mm512_mul_ps(t, exp_f32x16(_mm512_fmadd_ps(t, q, arg)));
    let near = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(z, _mm512_set1_ps(0.6));
    let e = _mm512_mask_blend_ps(near, _mm512_sub_ps(one, erfc), small);
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
    let e = _mm512_mask_blend_ps(nan, e, x);
    _mm512_castsi512_ps(_mm512_or_si512(
        _mm512_andnot_si512(sign, _mm512_castps_si512(e)),
        _mm512_and_si512(sign, bits),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in representable f32 values (ulps) between `got` and the f32 nearest `want`.
    fn ulps(got: f32, want: f64) -> u64 {
        let want = want as f32;
        if got == want || (got.is_nan() && want.is_nan()) {
            return 0;
        }
        if got.is_nan() || want.is_nan() {
            return u64::MAX;
        }
        // The bit patterns of finite floats, made monotone over the sign.
        let key = |v: f32| {
            let b = v.to_bits() as i64;
            if b < 0x8000_0000 {
                b
            } else {
                0x8000_0000 - b
            }
        };
        key(got).abs_diff(key(want))
    }

    /// Every `step`-th f32 (by bit pattern) in [lo, hi], positive and negative halves apart.
    fn sweep(lo: f32, hi: f32, step: u32) -> impl Iterator<Item = f32> {
        // Debug builds (the workspace's tests) sweep 16x sparser than release runs.
        let step = if cfg!(debug_assertions) {
            step * 16 + 1
        } else {
            step
        };
        let positive = (lo.max(0.0).to_bits()..=hi.max(0.0).to_bits()).step_by(step as usize);
        let negative = ((-hi).max(0.0).to_bits()..=(-lo).max(0.0).to_bits()).step_by(step as usize);
        positive
            .map(f32::from_bits)
            .chain(negative.map(|b| -f32::from_bits(b)))
            .filter(move |v| v.is_finite() && *v >= lo && *v <= hi)
    }

    /// The worst error of `f` against `reference` over a sweep, and where.
    fn worst(
        f: fn(f32) -> f32,
        reference: fn(f64) -> f64,
        xs: impl Iterator<Item = f32>,
    ) -> (u64, f32) {
        xs.map(|x| (ulps(f(x), reference(f64::from(x))), x))
            .max_by_key(|&(u, _)| u)
            .unwrap_or((0, 0.0))
    }

    const STEP: u32 = 509; // about 8.4 million inputs over all finite f32s (release)

    type F32Fn = fn(f32) -> f32;

    /// Both forms of a function: plain multiply-adds and fused ones.
    fn forms(plain: F32Fn, fused: F32Fn) -> [(&'static str, F32Fn); 2] {
        [("", plain), (" (FMA)", fused)]
    }

    #[test]
    fn exp_is_within_2_ulps_where_the_result_is_normal() {
        for (form, f) in forms(exp_f32::<false>, exp_f32::<true>) {
            let (u, at) = worst(f, f64::exp, sweep(-87.3, 88.7, STEP));
            println!("exp_f32{form}: at most {u} ulp (worst at {at})");
            assert!(u <= 2, "{u} ulps at {at}{form}");
            // Subnormal results: within 2^-148 absolute.
            for x in sweep(-103.9, -87.4, 3) {
                let err = (f64::from(f(x)) - f64::from(x).exp()).abs();
                assert!(err <= 2f64.powi(-148), "{err:e} at {x}{form}");
            }
        }
    }

    #[test]
    fn ln_is_within_2_ulps() {
        for (form, f) in forms(ln_f32::<false>, ln_f32::<true>) {
            let (u, at) = worst(f, f64::ln, sweep(0.0, f32::MAX, STEP / 4));
            println!("ln_f32{form}: at most {u} ulp (worst at {at})");
            assert!(u <= 2, "{u} ulps at {at}{form}");
            let (u, at) = worst(f, f64::ln, sweep(0.5, 2.0, 3));
            println!("ln_f32{form} on [0.5, 2]: at most {u} ulp (worst at {at})");
            assert!(u <= 2, "{u} ulps at {at} (near 1){form}");
        }
    }

    #[test]
    fn tanh_is_within_2_ulps() {
        for (form, f) in forms(tanh_f32::<false>, tanh_f32::<true>) {
            let (u, at) = worst(f, f64::tanh, sweep(f32::MIN, f32::MAX, STEP));
            println!("tanh_f32{form}: at most {u} ulp (worst at {at})");
            assert!(u <= 2, "{u} ulps at {at}{form}");
            let (u, at) = worst(f, f64::tanh, sweep(-1.0, 1.0, 11));
            println!("tanh_f32{form} on [-1, 1]: at most {u} ulp (worst at {at})");
            assert!(u <= 2, "{u} ulps at {at} (around the switch){form}");
        }
    }

    #[test]
    fn erf_is_within_4_ulps() {
        for (form, f) in forms(erf_f32::<false>, erf_f32::<true>) {
            let (u, at) = worst(f, libm::erf, sweep(f32::MIN, f32::MAX, STEP));
            println!("erf_f32{form}: at most {u} ulp (worst at {at})");
            assert!(u <= 4, "{u} ulps at {at}{form}");
            let (u, at) = worst(f, libm::erf, sweep(-4.0, 4.0, 11));
            println!("erf_f32{form} on [-4, 4]: at most {u} ulp (worst at {at})");
            assert!(u <= 4, "{u} ulps at {at} (the curved part){form}");
        }
    }

    /// Inputs for the vector exps' bit-for-bit tests, in chunks of `lanes`: in file order (runs
    /// of one kind: normal, subnormal, overflowing, NaN results) and interleaved (lanes of every
    /// kind together).
    fn exp_lanes(lanes: usize) -> Vec<Vec<f32>> {
        let mut xs: Vec<f32> = sweep(f32::MIN, f32::MAX, STEP)
            .chain(sweep(-104.5, 89.5, 7))
            .collect();
        xs.extend([
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
        ]);
        in_lanes(&xs, lanes)
    }

    /// `xs` in chunks of `lanes`, in order and interleaved (a leftover short of a chunk is
    /// dropped from each).
    fn in_lanes(xs: &[f32], lanes: usize) -> Vec<Vec<f32>> {
        let stride = xs.len() / lanes + 1;
        let interleaved: Vec<f32> = (0..stride)
            .flat_map(|i| xs.iter().skip(i).step_by(stride).copied())
            .collect();
        xs.chunks_exact(lanes)
            .chain(interleaved.chunks_exact(lanes))
            .map(<[f32]>::to_vec)
            .collect()
    }

    /// Every lane of `got` is `scalar` of its input, bit for bit (any NaN for a NaN).
    fn assert_bitwise(name: &str, scalar: fn(f32) -> f32, xs: &[f32], got: &[f32]) {
        for (x, g) in xs.iter().zip(got) {
            let want = scalar(*x);
            assert!(
                g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                "{name}({x:e}): {g:e} against {want:e}"
            );
        }
    }

    /// `f` over each 16 inputs against `scalar`, bit for bit, where the CPU has AVX-512F (a
    /// message where it has not).
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    fn check_avx512(
        name: &str,
        f: unsafe fn(super::arch::__m512) -> super::arch::__m512,
        scalar: fn(f32) -> f32,
        inputs: &[Vec<f32>],
    ) {
        use super::arch::*;
        if !is_x86_feature_detected!("avx512f") {
            eprintln!("this CPU has no AVX-512F: {name}_f32x16 cannot run here");
            return;
        }
        for x16 in inputs {
            let mut got = [0.0f32; 16];
            // SAFETY: AVX-512F was detected above; `in_lanes` chunks hold 16 floats.
            unsafe {
                _mm512_storeu_ps(got.as_mut_ptr(), f(_mm512_loadu_ps(x16.as_ptr())));
            }
            assert_bitwise(name, scalar, x16, &got);
        }
    }

    /// The AVX2 exp against the scalar one, bit for bit.
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    #[test]
    fn the_avx2_exp_is_the_scalar_exp_bit_for_bit() {
        use super::arch::*;
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("this CPU has no AVX2 and FMA: exp_f32x8 cannot run here");
            return;
        }
        for x8 in exp_lanes(8) {
            let mut got = [0.0f32; 8];
            // SAFETY: AVX2 and FMA were detected above; loads and stores of 8 floats.
            unsafe {
                _mm256_storeu_ps(got.as_mut_ptr(), exp_f32x8(_mm256_loadu_ps(x8.as_ptr())));
            }
            assert_bitwise("exp", exp_f32::<true>, &x8, &got);
        }
    }

    /// The AVX-512 exp against the scalar one, bit for bit.
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    #[test]
    fn the_avx512_exp_is_the_scalar_exp_bit_for_bit() {
        check_avx512("exp", exp_f32x16, exp_f32::<true>, &exp_lanes(16));
    }

    /// The AVX-512 erf against the scalar one, bit for bit.
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    #[test]
    fn the_avx512_erf_is_the_scalar_erf_bit_for_bit() {
        let mut xs: Vec<f32> = sweep(f32::MIN, f32::MAX, STEP)
            .chain(sweep(-5.0, 5.0, 7))
            .collect();
        xs.extend([
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            0.6,
            -0.6,
            4.0,
        ]);
        check_avx512("erf", erf_f32x16, erf_f32::<true>, &in_lanes(&xs, 16));
    }

    #[test]
    fn special_values_follow_ieee() {
        special_values::<false>();
        special_values::<true>();
    }

    fn special_values<const FMA: bool>() {
        assert!(exp_f32::<FMA>(f32::NAN).is_nan() && ln_f32::<FMA>(f32::NAN).is_nan());
        assert!(tanh_f32::<FMA>(f32::NAN).is_nan() && erf_f32::<FMA>(f32::NAN).is_nan());
        assert_eq!(exp_f32::<FMA>(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32::<FMA>(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32::<FMA>(100.0), f32::INFINITY);
        assert_eq!(exp_f32::<FMA>(0.0), 1.0);
        assert_eq!(ln_f32::<FMA>(0.0), f32::NEG_INFINITY);
        assert_eq!(ln_f32::<FMA>(-0.0), f32::NEG_INFINITY);
        assert!(ln_f32::<FMA>(-1.0).is_nan());
        assert_eq!(ln_f32::<FMA>(f32::INFINITY), f32::INFINITY);
        assert_eq!(ln_f32::<FMA>(1.0), 0.0);
        assert_eq!(tanh_f32::<FMA>(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32::<FMA>(f32::NEG_INFINITY), -1.0);
        assert_eq!(erf_f32::<FMA>(f32::INFINITY), 1.0);
        assert_eq!(erf_f32::<FMA>(f32::NEG_INFINITY), -1.0);
        assert_eq!(erf_f32::<FMA>(0.0), 0.0);
        assert!(
            tanh_f32::<FMA>(-0.0).is_sign_negative() && erf_f32::<FMA>(-0.0).is_sign_negative()
        );
    }
}
