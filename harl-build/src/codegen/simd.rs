//! Explicit SIMD for vector loops in the x86 variants.
//!
//! A loop the schedule vectorised is emitted as chunks of `core::arch` vector operations when
//! its body is one store or accumulator update of `f32` values built from loads that are
//! contiguous (or constant) along the loop, arithmetic and min/max: a register tile's
//! `acc[r][v] += x[r] * w[v]`, an epilogue's `out[v] = max(acc[v] + bias, 0)`. Left to LLVM,
//! such loops were sometimes vectorised across the wrong dimension (pairs of unrolled rows with
//! the filter broadcast, 4-wide): a stride-2 convolution with its filter axis vectorised ran at
//! 20 GFLOP/s emitted as loops and at 230 emitted this way (2 threads, 2026-12-03). Any other
//! loop keeps the scalar form and the compiler's vectoriser. The chunk that does not fill a
//! vector runs the scalar body.
//!
//! Each operation computes what the scalar code computes, bit for bit: a multiply-add is fused
//! in both (the variants with SIMD have FMA), and min/max return the other operand when one is
//! NaN, as `f32::max` does (the bare instructions return their second operand). The one
//! exception is a vectorised reduce loop into one accumulator: its lanes are reduced as a tree
//! (`horizontal`), which for a sum reassociates, as the schedule's vectorised reduction asks.

use super::Cx;
use crate::loop_ir::{in_bounds, masked_rest, LoopKind, Stmt};
use crate::target::Variant;
use harl_te::{BinaryOp, CmpOp, DType, Expr, ReduceOp, TensorRef, UnaryOp};

/// One vector width: its lane count and intrinsic prefix, and the lanes a chunk uses (fewer
/// in a loop's masked last chunk: its loads and stores of tensors touch only those).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Width {
    lanes: usize,
    prefix: &'static str,
    used: usize,
}

const ZMM: Width = Width {
    lanes: 16,
    prefix: "_mm512",
    used: 16,
};
const YMM: Width = Width {
    lanes: 8,
    prefix: "_mm256",
    used: 8,
};
const XMM: Width = Width {
    lanes: 4,
    prefix: "_mm",
    used: 4,
};

/// `__r0..__r7` (8 rows of 8 lanes) transposed into `__t0..__t7`: `__tj[i] = __ri[j]`.
const TRANSPOSE_8X8: &str = "let (__u0, __u1, __u2, __u3) = (_mm256_unpacklo_ps(__r0, __r1), _mm256_unpackhi_ps(__r0, __r1), _mm256_unpacklo_ps(__r2, __r3), _mm256_unpackhi_ps(__r2, __r3)); \
let (__u4, __u5, __u6, __u7) = (_mm256_unpacklo_ps(__r4, __r5), _mm256_unpackhi_ps(__r4, __r5), _mm256_unpacklo_ps(__r6, __r7), _mm256_unpackhi_ps(__r6, __r7)); \
let (__s0, __s1, __s2, __s3) = (_mm256_shuffle_ps::<0x44>(__u0, __u2), _mm256_shuffle_ps::<0xee>(__u0, __u2), _mm256_shuffle_ps::<0x44>(__u1, __u3), _mm256_shuffle_ps::<0xee>(__u1, __u3)); \
let (__s4, __s5, __s6, __s7) = (_mm256_shuffle_ps::<0x44>(__u4, __u6), _mm256_shuffle_ps::<0xee>(__u4, __u6), _mm256_shuffle_ps::<0x44>(__u5, __u7), _mm256_shuffle_ps::<0xee>(__u5, __u7)); \
let (__t0, __t1, __t2, __t3) = (_mm256_permute2f128_ps::<0x20>(__s0, __s4), _mm256_permute2f128_ps::<0x20>(__s1, __s5), _mm256_permute2f128_ps::<0x20>(__s2, __s6), _mm256_permute2f128_ps::<0x20>(__s3, __s7)); \
let (__t4, __t5, __t6, __t7) = (_mm256_permute2f128_ps::<0x31>(__s0, __s4), _mm256_permute2f128_ps::<0x31>(__s1, __s5), _mm256_permute2f128_ps::<0x31>(__s2, __s6), _mm256_permute2f128_ps::<0x31>(__s3, __s7));";

/// The vector widths a variant emits explicitly, widest first.
pub(super) fn widths(variant: Variant) -> &'static [Width] {
    match variant {
        Variant::Avx512 => &[ZMM, YMM, XMM],
        Variant::Avx2 => &[YMM, XMM],
        Variant::Base => &[],
    }
}

/// The `use` of the intrinsics, for a variant module that emits them.
pub(super) fn prelude(variant: Variant) -> &'static str {
    if widths(variant).is_empty() {
        ""
    } else {
        "#[allow(unused_imports)]\n#[cfg(target_arch = \"x86_64\")]\nuse ::core::arch::x86_64::*;\n#[allow(unused_imports)]\n#[cfg(target_arch = \"x86\")]\nuse ::core::arch::x86::*;\n"
    }
}

impl Width {
    fn op(self, name: &str, args: &[&str]) -> String {
        format!("{}_{name}_ps({})", self.prefix, args.join(", "))
    }
    fn is_masked(self) -> bool {
        self.used < self.lanes
    }
    /// This width with every lane used: for the accumulator block, whose rows are padded to
    /// whole vectors.
    fn whole(self) -> Width {
        Width {
            used: self.lanes,
            ..self
        }
    }
    /// The mask of this width's first `n` lanes: a vector for AVX's `maskload`, a `__mmask16`
    /// for AVX-512's masked moves.
    fn first_lanes(self, n: usize) -> String {
        if self.lanes == ZMM.lanes {
            return format!("{:#06x}u16", (1u32 << n.min(16)) - 1);
        }
        let lanes: Vec<&str> = (0..self.lanes)
            .map(|l| if l < n { "-1" } else { "0" })
            .collect();
        format!("{}_setr_epi32({})", self.prefix, lanes.join(", "))
    }
    fn load(self, ptr: &str) -> String {
        if !self.is_masked() {
            self.op("loadu", &[ptr])
        } else if self.lanes == ZMM.lanes {
            format!(
                "_mm512_maskz_loadu_ps({}, {ptr})",
                self.first_lanes(self.used)
            )
        } else {
            self.op("maskload", &[ptr, &self.first_lanes(self.used)])
        }
    }
    /// The elements at `ptr[0], ptr[2], .., ptr[2 * (lanes - 1)]` (a stride-2 read: a strided
    /// convolution's or pooling's input row): two loads, the second masked to end at the last
    /// element the lanes read, so nothing past the scalar reads is touched, then the even
    /// elements gathered by a permute.
    fn load_even(self, ptr: &str) -> String {
        if self.is_masked() && self.lanes == ZMM.lanes {
            // The used lanes read `2 * used - 1` elements: the loads mask the rest.
            let n = 2 * self.used - 1;
            let lo = if n >= 16 {
                "_mm512_loadu_ps(__s)".to_string()
            } else {
                format!("_mm512_maskz_loadu_ps({}, __s)", self.first_lanes(n))
            };
            return format!(
                "{{ let __s = {ptr}; _mm512_permutex2var_ps({lo}, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), _mm512_maskz_loadu_ps({}, __s.add(16))) }}",
                self.first_lanes(n.saturating_sub(16))
            );
        }
        if self.is_masked() {
            // The used lanes read `2 * used - 1` elements: the loads mask the rest.
            let n = 2 * self.used - 1;
            let lo = if n >= 8 {
                "_mm256_loadu_ps(__s)".to_string()
            } else {
                format!("_mm256_maskload_ps(__s, {})", self.first_lanes(n))
            };
            let hi = if n > 8 {
                format!(
                    "_mm256_maskload_ps(__s.add(8), {})",
                    self.first_lanes(n - 8)
                )
            } else {
                "_mm256_setzero_ps()".to_string()
            };
            return format!(
                "{{ let __s = {ptr}; let __t = _mm256_shuffle_ps::<0b10_00_10_00>({lo}, {hi}); _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(__t))) }}"
            );
        }
        match self.lanes {
            16 => format!(
                "{{ let __s = {ptr}; _mm512_permutex2var_ps(_mm512_loadu_ps(__s), _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), _mm512_maskz_loadu_ps(0x7fff, __s.add(16))) }}"
            ),
            8 => format!(
                "{{ let __s = {ptr}; let __t = _mm256_shuffle_ps::<0b10_00_10_00>(_mm256_loadu_ps(__s), _mm256_maskload_ps(__s.add(8), _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, -1, 0))); _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(__t))) }}"
            ),
            _ => format!(
                "{{ let __s = {ptr}; _mm_shuffle_ps::<0b10_00_10_00>(_mm_loadu_ps(__s), _mm_maskload_ps(__s.add(4), _mm_setr_epi32(-1, -1, -1, 0))) }}"
            ),
        }
    }
    /// The lanes of `t[..]` at `ptr` (lane 0's address, which may lie outside the tensor: it is
    /// only offset, never read) that `mask` (a `u32` of element bits, an AVX-512 mask register's
    /// worth) selects; zero in the others. With `even`, the even elements of the `2 * lanes`
    /// from `ptr` (a stride-2 read), `mask` then selecting elements, not lanes. Masked loads
    /// touch no memory in their unselected elements, so elements outside the tensor are never
    /// read. The AVX-512 variant only (128- and 256-bit masked moves are AVX-512VL).
    fn masked_load(self, ptr: &str, mask: &str, even: bool) -> String {
        let kind = if self.lanes == ZMM.lanes { "u16" } else { "u8" };
        let load =
            |m: &str, at: &str| format!("{}_maskz_loadu_ps(({m}) as {kind}, {at})", self.prefix);
        if !even {
            return format!("{{ let __m: u32 = {mask}; {} }}", load("__m", ptr));
        }
        if self.lanes < ZMM.lanes {
            // The `2 * lanes - 1` elements fit one 512-bit load: one load and one permute.
            let cast = if self.lanes == YMM.lanes {
                "_mm512_castps512_ps256"
            } else {
                "_mm512_castps512_ps128"
            };
            return format!(
                "{{ let __m: u32 = {mask}; {cast}(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0), _mm512_maskz_loadu_ps(__m as u16, {ptr}))) }}"
            );
        }
        let (lo, hi) = (
            load("__m", "__s"),
            load(
                &format!("__m >> {}", self.lanes),
                &format!("__s.wrapping_add({})", self.lanes),
            ),
        );
        let gather = match self.lanes {
            16 => format!("_mm512_permutex2var_ps({lo}, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), {hi})"),
            8 => format!("{{ let __t = _mm256_shuffle_ps::<0b10_00_10_00>({lo}, {hi}); _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(__t))) }}"),
            _ => format!("_mm_shuffle_ps::<0b10_00_10_00>({lo}, {hi})"),
        };
        format!("{{ let __m: u32 = {mask}; let __s = {ptr}; {gather} }}")
    }
    /// `yes` in the lanes `mask` (a `u32` of lane bits) selects, `no` in the others (AVX-512).
    fn blend(self, mask: &str, no: &str, yes: &str) -> String {
        let kind = if self.lanes == ZMM.lanes { "u16" } else { "u8" };
        format!(
            "{}_mask_blend_ps(({mask}) as {kind}, {no}, {yes})",
            self.prefix
        )
    }
    fn splat(self, x: &str) -> String {
        self.op("set1", &[x])
    }
    fn store(self, ptr: &str, v: &str) -> String {
        if !self.is_masked() {
            return format!("{};", self.op("storeu", &[ptr, v]));
        }
        if self.lanes == ZMM.lanes {
            // AVX-512's masked store is one fast instruction (unlike AVX's `maskstore`).
            return format!(
                "_mm512_mask_storeu_ps({ptr}, {}, {v});",
                self.first_lanes(self.used)
            );
        }
        // The used lanes as 4-, 2- and 1-lane stores: a masked store is slow on some cores
        // (AMD's before Zen 4).
        let mut out =
            format!("{{ let __q = {ptr}; let __w = {v}; let __l = _mm256_castps256_ps128(__w); ");
        let (mut at, mut rest) = (0, self.used);
        if rest >= 4 {
            out.push_str("_mm_storeu_ps(__q, __l); let __l = _mm256_extractf128_ps::<1>(__w); ");
            (at, rest) = (4, rest - 4);
        }
        if rest >= 2 {
            out.push_str(&format!(
                "_mm_store_sd(__q.add({at}) as *mut f64, _mm_castps_pd(__l)); let __l = _mm_movehl_ps(__l, __l); "
            ));
            (at, rest) = (at + 2, rest - 2);
        }
        if rest == 1 {
            out.push_str(&format!("_mm_store_ss(__q.add({at}), __l); "));
        }
        out.push('}');
        out
    }
    /// `a.max(b)` / `a.min(b)` with `f32`'s NaN rule: where `b` is NaN, `a`.
    fn min_max(self, which: &str, a: &str, b: &str) -> String {
        let r = self.op(which, &["__a", "__b"]);
        let pick = if self.lanes == 16 {
            format!("_mm512_mask_blend_ps(_mm512_cmp_ps_mask::<3>(__b, __b), {r}, __a)")
        } else {
            format!(
                "{p}_blendv_ps({r}, __a, {p}_cmp_ps::<3>(__b, __b))",
                p = self.prefix
            )
        };
        format!("{{ let __a = {a}; let __b = {b}; {pick} }}")
    }
    /// The reduction of vector `v`'s lanes by `op` to one `f32`, as a tree. Max and min skip
    /// NaN lanes (each becomes the identity first), as a chain of `f32::max` does; a sum is
    /// reassociated.
    fn horizontal(self, op: ReduceOp, v: &str) -> String {
        let p = self.prefix;
        let (name, ident) = match op {
            ReduceOp::Sum => ("add", None),
            ReduceOp::Max => ("max", Some("f32::NEG_INFINITY")),
            ReduceOp::Min => ("min", Some("f32::INFINITY")),
        };
        let lanes = match ident {
            None => v.to_string(),
            Some(i) if self.lanes == 16 => format!(
                "_mm512_mask_blend_ps(_mm512_cmp_ps_mask::<3>({v}, {v}), {v}, _mm512_set1_ps({i}))"
            ),
            Some(i) => format!("{p}_blendv_ps({v}, {p}_set1_ps({i}), {p}_cmp_ps::<3>({v}, {v}))"),
        };
        let quad = match self.lanes {
            16 => return format!("{{ let __v = {lanes}; _mm512_reduce_{name}_ps(__v) }}"),
            8 => format!(
                "_mm_{name}_ps(_mm256_castps256_ps128(__v), _mm256_extractf128_ps::<1>(__v))"
            ),
            _ => "__v".to_string(),
        };
        format!(
            "{{ let __v = {lanes}; let __q = {quad}; let __q = _mm_{name}_ps(__q, _mm_movehl_ps(__q, __q)); _mm_cvtss_f32(_mm_{name}_ss(__q, _mm_shuffle_ps::<1>(__q, __q))) }}"
        )
    }
    fn combine(self, op: ReduceOp, cur: &str, v: &str) -> String {
        match op {
            ReduceOp::Sum => self.op("add", &[cur, v]),
            ReduceOp::Max => self.min_max("max", cur, v),
            ReduceOp::Min => self.min_max("min", cur, v),
        }
    }
}

/// The coefficient of loop variable `v` in index expression `e`, if `e` is affine in `v` with
/// a constant coefficient (structurally: no division or modulo of `v`, no product of `v` with
/// anything but a constant).
fn coefficient(e: &Expr, v: usize) -> Option<i64> {
    match e {
        Expr::Axis(a) => Some(i64::from(*a == v)),
        Expr::Const(..) => Some(0),
        Expr::Binary(BinaryOp::Add, a, b) => coefficient(a, v)?.checked_add(coefficient(b, v)?),
        Expr::Binary(BinaryOp::Sub, a, b) => coefficient(a, v)?.checked_sub(coefficient(b, v)?),
        Expr::Binary(BinaryOp::Mul, a, b) => match (coefficient(a, v)?, coefficient(b, v)?) {
            (0, 0) => Some(0),
            (ca, 0) => ca.checked_mul(b.eval_int(&[])?),
            (0, cb) => a.eval_int(&[])?.checked_mul(cb),
            _ => None,
        },
        _ if uses_var(e, v) => None,
        _ => Some(0),
    }
}

/// The terms of a conjunction (`a && b && ..`).
fn conjuncts<'a>(e: &'a Expr, out: &mut Vec<&'a Expr>) {
    match e {
        Expr::Binary(BinaryOp::And, a, b) => {
            conjuncts(a, out);
            conjuncts(b, out);
        }
        _ => out.push(e),
    }
}

fn uses_var(e: &Expr, v: usize) -> bool {
    let mut found = false;
    e.visit(&mut |x| found |= *x == Expr::Axis(v));
    found
}

/// A streamed operand is prefetched only where its buffer is larger than this: a smaller one
/// stays in L2 between its passes (2 MB on the AVX-512 CPUs measured; 512 KB to 1 MB on
/// older ones), and its prefetches would only take load slots.
const PREFETCH_MIN_BYTES: usize = 1 << 20;

/// Whether `s` is or holds an accumulator update.
fn accumulates(s: &Stmt) -> bool {
    matches!(s, Stmt::AccUpdate { .. }) || s.body().iter().any(accumulates)
}

/// The loads of `stmts`, and the variables of the unrolled and vectorised loops among them;
/// `None` where a loop of another kind is inside (the loop holding them is not innermost).
fn innermost_loads(
    stmts: &[Stmt],
    loads: &mut Vec<(TensorRef, Vec<Expr>)>,
    inner: &mut Vec<usize>,
) -> Option<()> {
    for s in stmts {
        if let Stmt::For {
            var, kind, extent, ..
        } = s
        {
            // A split's extent-1 part (a 1x1 convolution's window) inside the reduction
            // leaves it innermost; a longer loop is a loop of its own.
            if !matches!(kind, LoopKind::Unrolled | LoopKind::Vectorized) && *extent > 1 {
                return None;
            }
            inner.push(*var);
        }
        for e in s.exprs() {
            e.visit(&mut |x| {
                if let Expr::Load(t, idx) = x {
                    loads.push((*t, idx.clone()));
                }
            });
        }
        innermost_loads(s.body(), loads, inner)?;
    }
    Some(())
}

impl Cx<'_> {
    /// Emits `for v in 0..extent { body }` (a vectorised loop) as explicit vector chunks;
    /// false, with nothing emitted, when the variant has no vector width for it or the body is
    /// not of the supported form.
    pub(super) fn vector_loop(&mut self, var: usize, extent: usize, body: &[Stmt]) -> bool {
        let substituted;
        let stmt = match body {
            [stmt] => stmt,
            [lets @ .., stmt] if lets.iter().all(|l| matches!(l, Stmt::Let { .. })) => {
                // A fused loop binds its parts (`v / n % m`) first: substituted and simplified,
                // an index over contiguous axes is affine in `v` again.
                substituted = self.without_lets(lets, stmt);
                &substituted
            }
            _ => return false,
        };
        let Some(pieces) = self.pieces(var, extent, stmt) else {
            return false;
        };
        let done: usize = pieces.iter().map(|(w, count, _)| w.used * count).sum();
        let mut start = 0;
        for (w, count, vector) in pieces {
            if count <= 4 {
                // Copies, not a loop: the accumulator's vectors stay at constant offsets.
                for c in 0..count {
                    self.line(&format!("{{ let v{var}: isize = {};", start + c * w.lanes));
                    self.line(&format!("    {vector}"));
                    self.line("}");
                }
            } else {
                self.line(&format!("for __c{var} in 0..{count}isize {{"));
                self.line(&format!(
                    "    let v{var}: isize = {start} + __c{var} * {};",
                    w.lanes
                ));
                self.line(&format!("    {vector}"));
                self.line("}");
            }
            start += count * w.used;
        }
        if done < extent {
            self.line(&format!("for v{var} in {done}isize..{extent}isize {{"));
            self.depth += 1;
            self.stmt(stmt);
            self.depth -= 1;
            self.line("}");
        }
        true
    }

    /// Prefetches for the body of an innermost reduction loop `for v{var} in 0..extent`: a
    /// load whose address moves by a cache line or more an iteration streams a panel through
    /// the register tile (a weight panel in a GEMM or a 1x1 convolution), and the loops
    /// around re-read that panel for every row tile before moving to the next one. Where the
    /// buffer is too large to stay in L2, the first row tile of each panel waited on memory
    /// (BERT's FFN weights, 9.4 MB: 212 GFLOP/s with caches evicted before each run against
    /// 240 warm, Zen 5); so each iteration prefetches, into L2, the same line of the panel
    /// that the innermost enclosing loop moving the load will read next (203 -> 226-231
    /// GFLOP/s evicted, 239 -> 237 warm). Empty where there is no such load, the variant has
    /// no explicit vectors, or the loop holds another serial loop.
    pub(super) fn stream_prefetches(
        &mut self,
        var: usize,
        extent: usize,
        body: &[Stmt],
    ) -> Vec<String> {
        if widths(self.variant).is_empty() || extent < 16 || !body.iter().any(accumulates) {
            return Vec::new();
        }
        let mut loads = Vec::new();
        let mut inner = Vec::new();
        if innermost_loads(body, &mut loads, &mut inner).is_none() {
            return Vec::new();
        }
        // f32 elements in a 64-byte cache line.
        let line_elems = 16;
        let mut seen: Vec<TensorRef> = Vec::new();
        let mut out = Vec::new();
        for (t, index) in loads {
            if seen.contains(&t) || self.buffer_bytes(t) <= PREFETCH_MIN_BYTES {
                continue;
            }
            let Some(step) = self.flat_coefficient(t, &index, var) else {
                continue;
            };
            if step < line_elems {
                continue;
            }
            // The enclosing loop that moves the panel next: its coefficient is at least the
            // panel's extent along `var`, so its next iteration reads other lines.
            let Some(&mover) = self.loops.iter().rev().find(|&&u| {
                self.flat_coefficient(t, &index, u).is_some_and(|c| {
                    c.unsigned_abs() >= step.unsigned_abs().saturating_mul(extent as u64)
                })
            }) else {
                continue;
            };
            seen.push(t);
            let next: Vec<Expr> = index
                .iter()
                .map(|e| {
                    e.map(&mut |n| match n {
                        Expr::Axis(v) if v == mover => Expr::Axis(v) + Expr::int(1),
                        Expr::Axis(v) if inner.contains(&v) => Expr::int(0),
                        other => other,
                    })
                })
                .collect();
            let flat = self.flat(t, &next);
            let base = super::base_ptr(t);
            // One prefetch a line the iteration reads, at most four.
            for line in 0..(step / line_elems).min(4) {
                out.push(format!(
                    "_mm_prefetch::<_MM_HINT_T1>({base}.wrapping_add({flat}).wrapping_add({}) as *const i8);",
                    line * line_elems
                ));
            }
        }
        out
    }

    /// Bytes of the `f32` buffer `t` names (a folded stage's one slice).
    fn buffer_bytes(&self, t: TensorRef) -> usize {
        let elems: usize = match t {
            TensorRef::Stage(s) => self.p.buffer_len(s),
            TensorRef::Input(_) => self.p.graph.shape(t).iter().product(),
        };
        elems.saturating_mul(4)
    }

    /// `stmt` with the variables `lets` bind replaced by their values, then simplified
    /// (`crate::simplify`: a fused loop's parts recombine where the axes are contiguous).
    fn without_lets(&self, lets: &[Stmt], stmt: &Stmt) -> Stmt {
        let mut bound: Vec<(usize, Expr)> = Vec::new();
        let subst = |e: &Expr, bound: &[(usize, Expr)]| {
            e.map(&mut |n| match n {
                Expr::Axis(v) => bound
                    .iter()
                    .find(|(b, _)| *b == v)
                    .map_or(Expr::Axis(v), |(_, value)| value.clone()),
                other => other,
            })
        };
        for l in lets {
            if let Stmt::Let { var, value } = l {
                let value = subst(value, &bound);
                bound.push((*var, value));
            }
        }
        let mut out = stmt.clone();
        let extents = &self.p.var_extents;
        out.map_exprs(&|e| crate::simplify::expr(&subst(e, &bound), extents));
        out
    }

    /// Emits an accumulator block's write-back across the output's rows (a filter-major
    /// tile: `for u in 0..rows { for v in 0..width { out[.., v, .., u] = acc[u * s + v] } }`,
    /// the output contiguous along `u`, the block along `v`) as 8 x 8 transposes: each group
    /// of 8 of `v` is loaded as up to 8 vectors (one per `u`), transposed in registers, and
    /// stored as one vector along `u` per `v`, with the epilogue, if any, computed on it. A
    /// scalar store per element before (a 7x7 convolution's 8 pixels x 32 filters: 256 stores
    /// a block). False, with nothing emitted, when the loops are not of that form.
    pub(super) fn transposed_write_back(&mut self, u: usize, rows: usize, inner: &Stmt) -> bool {
        let Stmt::For {
            var: v,
            extent: width,
            kind: LoopKind::Serial | LoopKind::Vectorized,
            body,
        } = inner
        else {
            return false;
        };
        let (v, width) = (*v, *width);
        let [Stmt::AccStore {
            index,
            stage,
            dest,
            combine: None,
            epilogue,
        }] = body.as_slice()
        else {
            return false;
        };
        if !widths(self.variant).contains(&YMM)
            || !(2..=YMM.lanes).contains(&rows)
            || width % YMM.lanes != 0
            || self.p.graph.stages[self.stage].dtype != DType::F32
            || coefficient(index, v) != Some(1)
        {
            return false;
        }
        let w = Width { used: rows, ..YMM };
        let out_stage = epilogue.as_ref().map_or(*stage, |e| e.stage);
        let Some(ptr) = self.vector_ptr(TensorRef::Stage(out_stage), dest, u) else {
            return false;
        };
        let value = match epilogue {
            Some(e) => {
                self.forward = Some(*stage);
                let value = self.vector_expr(w, u, &e.value);
                self.forward = None;
                match value {
                    Some(value) => value,
                    None => return false,
                }
            }
            None => "__v".to_string(),
        };
        let i = self.idx(index);
        let store = w.store("__p", &value);
        self.line(&format!("for __g{v} in 0..{}isize {{", width / YMM.lanes));
        self.depth += 1;
        self.line(&format!("let v{v}: isize = __g{v} * 8;"));
        for r in 0..YMM.lanes {
            self.line(&if r < rows {
                format!("let __r{r} = {{ let v{u}: isize = {r}; _mm256_loadu_ps(acc.as_ptr().add(({i}) as usize)) }};")
            } else {
                format!("let __r{r} = _mm256_setzero_ps();")
            });
        }
        self.line(TRANSPOSE_8X8);
        for r in 0..YMM.lanes {
            self.line(&format!(
                "{{ let v{v}: isize = __g{v} * 8 + {r}; let v{u}: isize = 0; let __v = __t{r}; let __p = {ptr}; {store} }}"
            ));
        }
        self.depth -= 1;
        self.line("}");
        true
    }

    /// The chunks of a vector loop and the vector form of `stmt` in each: the widest vectors
    /// first, then one of each narrower width that still fits (27 lanes are 16 + 8 + 3
    /// scalars), then the scalar body; where [`masked_wide_tail`] or [`masked_tail`] says so
    /// and the statement has that form, the remainder after the 16- or 8-lane vectors is one
    /// masked vector of that width instead (28 lanes on AVX-512: 16 + a masked 12). None when
    /// the statement has no vector form.
    fn pieces(
        &mut self,
        var: usize,
        extent: usize,
        stmt: &Stmt,
    ) -> Option<Vec<(Width, usize, String)>> {
        let mut pieces = Vec::new();
        let mut done = 0;
        for (k, &w) in widths(self.variant).iter().enumerate() {
            let count = if k == 0 {
                (extent - done) / w.lanes
            } else {
                usize::from(extent - done >= w.lanes)
            };
            if count > 0 {
                pieces.push((w, count, self.vector_stmt(w, var, stmt)?));
                done += count * w.lanes;
            }
            // The rest, fewer than `w.lanes`: one masked vector of this width where the rule
            // for the width says so and the statement has that form.
            let rest = extent - done;
            if masked_rest(w.lanes, rest) {
                let tail = Width { used: rest, ..w };
                if let Some(vector) = self.vector_stmt(tail, var, stmt) {
                    pieces.push((tail, 1, vector));
                    break;
                }
            }
        }
        (!pieces.is_empty()).then_some(pieces)
    }

    /// The vector form of `stmt` at the chunk starting at `v{var}`.
    fn vector_stmt(&mut self, w: Width, var: usize, stmt: &Stmt) -> Option<String> {
        match stmt {
            Stmt::AccUpdate { index, op, value } if coefficient(index, var)? == 0 => {
                // A vectorised reduce loop into one accumulator element: the chunk's lanes
                // reduced as a tree (a schedule that vectorises a reduce loop reassociates it,
                // as rfactor does), then combined into the element. A masked chunk's unused
                // lanes would join the tree.
                if self.p.graph.stages[self.stage].dtype != DType::F32 || w.is_masked() {
                    return None;
                }
                let v = self.vector_expr(w, var, value)?;
                let h = w.horizontal(*op, "__v0");
                let new = match op {
                    ReduceOp::Sum => "*__a + __h",
                    ReduceOp::Max => "(*__a).max(__h)",
                    ReduceOp::Min => "(*__a).min(__h)",
                };
                let i = self.idx(index);
                Some(format!(
                    "{{ let __v0 = {v}; let __h = {h}; let __a = acc.get_unchecked_mut(({i}) as usize); *__a = {new}; }}"
                ))
            }
            Stmt::AccUpdate { index, op, value } => {
                if self.p.graph.stages[self.stage].dtype != DType::F32
                    || coefficient(index, var)? != 1
                    || !self.acc_whole(w, index)
                {
                    return None;
                }
                let cur = w.whole().load("__p");
                let new = match (op, value) {
                    (ReduceOp::Sum, Expr::Binary(BinaryOp::Mul, x, y)) => {
                        let x = self.vector_expr(w, var, x)?;
                        let y = self.vector_expr(w, var, y)?;
                        w.op("fmadd", &[&x, &y, &cur])
                    }
                    _ => {
                        let v = self.vector_expr(w, var, value)?;
                        w.combine(*op, &cur, &v)
                    }
                };
                let i = self.idx(index);
                Some(format!(
                    "{{ let __p = acc.as_mut_ptr().add(({i}) as usize); {} }}",
                    w.whole().store("__p", &new)
                ))
            }
            Stmt::Store {
                stage,
                index,
                value,
                combine,
            } => {
                let ptr = self.vector_ptr(TensorRef::Stage(*stage), index, var)?;
                let v = self.vector_expr(w, var, value)?;
                let new = match combine {
                    None => v,
                    Some(op) => w.combine(*op, &w.load("__p"), &v),
                };
                Some(format!("{{ let __p = {ptr}; {} }}", w.store("__p", &new)))
            }
            Stmt::AccStore {
                epilogue: Some(e),
                index,
                stage,
                dest,
                combine,
            } => {
                if self.p.graph.stages[self.stage].dtype != DType::F32
                    || coefficient(index, var)? != 1
                    || !self.acc_whole(w, index)
                {
                    return None;
                }
                let ptr = self.vector_ptr(TensorRef::Stage(e.stage), dest, var)?;
                let i = self.idx(index);
                let a = w.whole().load(&format!("acc.as_ptr().add(({i}) as usize)"));
                let a = match combine {
                    None => a,
                    Some(op) => {
                        let stored = self.vector_ptr(TensorRef::Stage(*stage), dest, var)?;
                        w.combine(*op, &w.load(&stored), &a)
                    }
                };
                self.forward = Some(*stage);
                let v = self.vector_expr(w, var, &e.value);
                self.forward = None;
                Some(format!(
                    "{{ let __v = {a}; let __p = {ptr}; {} }}",
                    w.store("__p", &v?)
                ))
            }
            Stmt::AccStore {
                index,
                stage,
                dest,
                combine,
                epilogue: None,
            } => {
                if self.p.graph.stages[self.stage].dtype != DType::F32
                    || coefficient(index, var)? != 1
                    || !self.acc_whole(w, index)
                {
                    return None;
                }
                let ptr = self.vector_ptr(TensorRef::Stage(*stage), dest, var)?;
                let i = self.idx(index);
                let a = w.whole().load(&format!("acc.as_ptr().add(({i}) as usize)"));
                let new = match combine {
                    None => a,
                    Some(op) => w.combine(*op, &w.load("__p"), &a),
                };
                Some(format!("{{ let __p = {ptr}; {} }}", w.store("__p", &new)))
            }
            _ => None,
        }
    }

    /// Whether the accumulator block holds chunk `w`'s every lane at `acc[index]`, the used
    /// and (in a masked chunk) the unused ones past the loop's end: interval analysis of the
    /// index against the block's length ([`crate::loop_ir::LoopKind::acc_row`] pads its rows).
    fn acc_whole(&self, w: Width, index: &Expr) -> bool {
        if !w.is_masked() {
            return true;
        }
        let (_, hi) = harl_te::graph::interval(index, &self.p.var_extents);
        i64::try_from(self.acc_len).is_ok_and(|len| hi + ((w.lanes - w.used) as i64) < len)
    }

    /// The address of `t[index]` at the chunk's first lane, when `t` holds `f32`, the access
    /// is provably in bounds and contiguous along `v{var}`.
    fn vector_ptr(&mut self, t: TensorRef, index: &[Expr], var: usize) -> Option<String> {
        (self.flat_coefficient(t, index, var)? == 1).then(|| self.address(t, index))
    }

    /// The address of `t[index]`.
    fn address(&mut self, t: TensorRef, index: &[Expr]) -> String {
        format!("{}.add({})", super::base_ptr(t), self.flat(t, index))
    }

    /// A vector of `t[idx]` where the access is not provably in bounds (a padded input read
    /// where the padding is inlined): lanes whose index is outside `t` are zero, as the scalar
    /// code's checked load gives, and their memory is not touched. Only where `v{var}` moves
    /// the last index alone, by 1 or 2, and the variant has mask registers (AVX-512).
    ///
    /// With `lanes` (a lane mask, unit stride only), lanes outside it are zero too.
    fn bounded_load(
        &mut self,
        w: Width,
        t: TensorRef,
        idx: &[Expr],
        var: usize,
        lanes: Option<&str>,
    ) -> Option<String> {
        let g = &self.p.graph;
        if self.variant != Variant::Avx512 || g.dtype(t) != DType::F32 {
            return None;
        }
        let shape = g.shape(t).to_vec();
        let (last, rest) = idx.split_last()?;
        let step = coefficient(last, var)?;
        if rest.iter().any(|e| uses_var(e, var))
            || !(step == 1 || step == 2)
            || (lanes.is_some() && step != 1)
        {
            return None;
        }
        let n = *shape.last()?;
        // The dimensions the lanes do not move: in bounds for all of them or for none.
        let mut ok = Vec::new();
        for (e, d) in rest.iter().zip(&shape) {
            let i = self.idx(e);
            ok.push(format!("({i}) >= 0 && ({i}) < {d} && "));
        }
        let r = self.idx(last);
        // The elements the lanes read: one each, or every other of a stride-2 run.
        let span = if step == 1 { w.used } else { 2 * w.used - 1 };
        let mask = format!(
            "{{ let __r: isize = {r}; let __lo = (-__r).clamp(0, {span}); let __hi = ({n} - __r).clamp(0, {span}); if {}__lo < __hi {{ ((1u64 << __hi) - (1u64 << __lo)) as u32 }} else {{ 0u32 }} }}",
            ok.concat()
        );
        let mask = match lanes {
            Some(l) => format!("({mask} & {l})"),
            None => mask,
        };
        let ptr = format!(
            "{}.wrapping_offset(({}) as isize)",
            super::base_ptr(t),
            self.flat(t, idx)
        );
        Some(w.masked_load(&ptr, &mask, step == 2))
    }

    /// The lanes of the chunk where `cond` holds, as a `u32` of lane bits: `cond` a
    /// conjunction of comparisons affine in `v{var}` (a padding's bounds), or of conditions
    /// that do not depend on it. AVX-512 only (the mask feeds a mask register).
    fn lane_mask(&mut self, w: Width, var: usize, cond: &Expr) -> Option<String> {
        if self.variant != Variant::Avx512 {
            return None;
        }
        let mut terms = Vec::new();
        conjuncts(cond, &mut terms);
        let mut body = format!(
            "let mut __lo: isize = 0; let mut __hi: isize = {}; ",
            w.used
        );
        for c in terms {
            if !uses_var(c, var) {
                let (c, _) = self.expr(c);
                body.push_str(&format!("if !{c} {{ __hi = 0; }} "));
                continue;
            }
            let Expr::Cmp(op, a, b) = c else {
                return None;
            };
            let d = Expr::Binary(BinaryOp::Sub, a.clone(), b.clone());
            let k = coefficient(&d, var)?;
            let d = self.idx(&d);
            // Each comparison as `k * lane + d >= 0`.
            let (k, d) = match op {
                CmpOp::Ge => (k, d),
                CmpOp::Gt => (k, format!("({d} - 1)")),
                CmpOp::Le => (-k, format!("(-{d})")),
                CmpOp::Lt => (-k, format!("(-{d} - 1)")),
                CmpOp::Eq | CmpOp::Ne => return None,
            };
            body.push_str(&match k.cmp(&0) {
                std::cmp::Ordering::Greater => {
                    format!("__lo = __lo.max((-{d} + {}).div_euclid({k})); ", k - 1)
                }
                std::cmp::Ordering::Less => {
                    format!("__hi = __hi.min(({d}).div_euclid({}) + 1); ", -k)
                }
                std::cmp::Ordering::Equal => format!("if {d} < 0 {{ __hi = 0; }} "),
            });
        }
        Some(format!(
            "{{ {body}if __lo < __hi {{ ((1u64 << __hi) - (1u64 << __lo)) as u32 }} else {{ 0u32 }} }}"
        ))
    }

    /// The coefficient of `v{var}` in the flat offset of an in-bounds `f32` access.
    fn flat_coefficient(&self, t: TensorRef, index: &[Expr], var: usize) -> Option<i64> {
        let g = &self.p.graph;
        let shape = g.shape(t);
        if g.dtype(t) != DType::F32 || !in_bounds(index, shape, &self.p.var_extents) {
            return None;
        }
        let (index, shape) = self.p.view(t, index);
        let mut strides = Vec::with_capacity(index.len());
        let mut stride = 1i64;
        for &n in shape.iter().rev() {
            strides.push(stride);
            stride = stride.checked_mul(i64::try_from(n).ok()?)?;
        }
        let per_dim = index
            .iter()
            .rev()
            .zip(&strides)
            .try_fold(0i64, |total, (e, &s)| {
                total.checked_add(coefficient(e, var)?.checked_mul(s)?)
            });
        per_dim.or_else(|| {
            // Per dimension, a fused loop's parts (`v / 7`, `v % 7`) are not affine; in the
            // flat offset of contiguous dimensions they recombine into `v` (`crate::simplify`).
            let flat = index
                .iter()
                .rev()
                .zip(&strides)
                .fold(Expr::int(0), |f, (e, &s)| f + e.clone() * Expr::int(s));
            coefficient(&crate::simplify::expr(&flat, &self.p.var_extents), var)
        })
    }

    /// A vector of the `f32` values of `e` at the chunk's lanes.
    fn vector_expr(&mut self, w: Width, var: usize, e: &Expr) -> Option<String> {
        if let Expr::Load(TensorRef::Stage(s), _) = e {
            if self.forward == Some(*s) {
                return Some("__v".into());
            }
        }
        if !uses_var(e, var) {
            // The same in every lane: the scalar code, once.
            let (s, ty) = self.expr(e);
            return (ty == super::Ty::Val(DType::F32)).then(|| w.splat(&s));
        }
        match e {
            Expr::Load(t, idx) if self.flat_coefficient(*t, idx, var).is_some() => {
                match self.flat_coefficient(*t, idx, var)? {
                    1 => {
                        let ptr = self.address(*t, idx);
                        Some(w.load(&ptr))
                    }
                    0 => {
                        let (s, _) = self.expr(e);
                        Some(w.splat(&s))
                    }
                    2 => {
                        let ptr = self.address(*t, idx);
                        Some(w.load_even(&ptr))
                    }
                    _ => None,
                }
            }
            Expr::Load(t, idx) => self.bounded_load(w, *t, idx, var, None),
            Expr::Select(c, a, b) => {
                let yes = self.vector_expr(w, var, a)?;
                let no = self.vector_expr(w, var, b)?;
                if !uses_var(c, var) {
                    let (c, _) = self.expr(c);
                    return Some(format!("(if {c} {{ {yes} }} else {{ {no} }})"));
                }
                let mask = self.lane_mask(w, var, c)?;
                // A padded read (`cond ? x[..] : 0`): the select's lanes join the load's mask,
                // no blend.
                if let (Expr::Load(t, idx), Expr::Const(zero, _)) = (&**a, &**b) {
                    if zero.to_bits() == 0 && self.flat_coefficient(*t, idx, var).is_none() {
                        if let Some(v) = self.bounded_load(w, *t, idx, var, Some(&mask)) {
                            return Some(v);
                        }
                    }
                }
                Some(w.blend(&mask, &no, &yes))
            }
            Expr::Binary(op, a, b) => {
                let x = self.vector_expr(w, var, a)?;
                let y = self.vector_expr(w, var, b)?;
                match op {
                    BinaryOp::Add => Some(w.op("add", &[&x, &y])),
                    BinaryOp::Sub => Some(w.op("sub", &[&x, &y])),
                    BinaryOp::Mul => Some(w.op("mul", &[&x, &y])),
                    BinaryOp::Div => Some(w.op("div", &[&x, &y])),
                    BinaryOp::Max => Some(w.min_max("max", &x, &y)),
                    BinaryOp::Min => Some(w.min_max("min", &x, &y)),
                    _ => None,
                }
            }
            Expr::Unary(UnaryOp::Neg, a) => {
                let x = self.vector_expr(w, var, a)?;
                Some(w.op("mul", &[&x, &w.splat("(-1.0f32)")]))
            }
            Expr::Unary(UnaryOp::Sqrt, a) => {
                let x = self.vector_expr(w, var, a)?;
                Some(w.op("sqrt", &[&x]))
            }
            Expr::Unary(UnaryOp::Exp, a) if w.lanes >= YMM.lanes => {
                // Written with AVX2 or AVX-512 intrinsics, the scalar exp's results bit for bit
                // (both variants that emit 8-lane vectors enable AVX2 and FMA; 16-lane ones
                // come from the AVX-512 variant alone).
                let x = self.vector_expr(w, var, a)?;
                let f = if w.lanes == ZMM.lanes {
                    "exp_f32x16"
                } else {
                    "exp_f32x8"
                };
                Some(format!("::harl::runtime::math::{f}({x})"))
            }
            Expr::Unary(UnaryOp::Erf, a) if w.lanes == ZMM.lanes => {
                // The scalar erf's results bit for bit, on 512-bit vectors (a GELU write-back),
                // where the lane loop below stores, calls and reloads (the compiler vectorised
                // that nearly as well: BERT's FFN-up kernel 1% faster with this).
                let x = self.vector_expr(w, var, a)?;
                Some(format!("::harl::runtime::math::erf_f32x16({x})"))
            }
            Expr::Unary(op @ (UnaryOp::Exp | UnaryOp::Log | UnaryOp::Tanh | UnaryOp::Erf), a) => {
                // harl's branch-free functions (the scalar code's, in these variants) over the
                // lanes: a loop the compiler vectorises once it sees it whole. It does so for
                // 16 lanes; an 8-lane copy of exp stayed scalar on AVX2 (1.7 ns an element
                // against 0.4 as a plain loop), so narrower vectors leave the loop to it (but
                // for exp, above).
                if w.lanes != ZMM.lanes {
                    return None;
                }
                let f = match op {
                    UnaryOp::Exp => "exp_f32",
                    UnaryOp::Log => "ln_f32",
                    UnaryOp::Tanh => "tanh_f32",
                    _ => "erf_f32",
                };
                let x = self.vector_expr(w, var, a)?;
                let l = w.lanes;
                Some(format!(
                    "{{ let mut __t = [0.0f32; {l}]; {} for __l in 0..{l} {{ __t[__l] = ::harl::runtime::math::{f}::<FMA>(__t[__l]); }} {} }}",
                    w.store("__t.as_mut_ptr()", &x),
                    w.load("__t.as_ptr()")
                ))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::default_schedule::default_schedule;
    use crate::lower::lower;
    use harl_te::ops::workloads as w;

    fn nest_source(g: &harl_te::Graph, variant: Variant) -> String {
        let target = variant.cpu_target("x86_64", 1);
        let p = lower(g, &default_schedule(g, &target)).expect("lowers");
        let mut out = String::new();
        for (n, nest) in p.nests.iter().enumerate() {
            super::super::emit_nest(
                &mut out,
                &p,
                n,
                nest,
                variant,
                super::super::SOURCE_UNROLL_BYTES,
            );
        }
        out
    }

    fn weights_of(mut g: harl_te::Graph) -> harl_te::Graph {
        g.inputs[1].constant = true;
        g
    }

    #[test]
    fn panels_larger_than_l2_prefetch_the_next_panel_into_l2() {
        // BERT's FFN: 768 x 3072 weights, 9.4 MB of panels.
        let big = nest_source(&w::matmul(128, 768, 3072).expect("matmul"), Variant::Avx512);
        let prefetch = big
            .lines()
            .find(|l| l.contains("_mm_prefetch::<_MM_HINT_T1>"))
            .unwrap_or_else(|| panic!("{big}"));
        // Two lines of the 32-wide panel a step, each at the next panel (its loop variable
        // plus one), never inside the loop the prefetch serves.
        assert_eq!(big.matches("_mm_prefetch").count(), 2, "{big}");
        assert!(prefetch.contains(" + 1isize)"), "{prefetch}");
        assert!(big.contains(".wrapping_add(16) as *const i8"), "{big}");
        // ResNet-50's stage-4 downsampling 1x1 convolution (8 MB of filters): its window's
        // extent-1 loops inside the channel loop leave that loop innermost.
        let conv = weights_of(
            w::conv2d(1, 1024, 14, 14, 2048, 1, 1, 2, 0, 1, 1).expect("1x1 conv, stride 2"),
        );
        let src = nest_source(&conv, Variant::Avx512);
        assert!(src.contains("_mm_prefetch::<_MM_HINT_T1>"), "{src}");
        // 1 MB of panels stays in L2: no prefetch; nor without explicit vectors.
        let small = nest_source(&w::matmul(128, 512, 512).expect("matmul"), Variant::Avx512);
        assert!(!small.contains("_mm_prefetch"), "{small}");
        // The compiled case of `tests/codegen.rs`, its weight prepared: 1.1 MB of panels.
        let g = weights_of(w::matmul(16, 512, 544).expect("matmul"));
        for variant in [Variant::Avx512, Variant::Avx2] {
            assert!(
                nest_source(&g, variant).contains("_mm_prefetch"),
                "{variant:?}"
            );
        }
        let base = nest_source(&w::matmul(128, 768, 3072).expect("matmul"), Variant::Base);
        assert!(!base.contains("_mm_prefetch"), "{base}");
    }

    #[test]
    fn register_tiles_are_explicit_fused_multiply_adds() {
        let g = w::matmul(64, 64, 64).expect("matmul");
        let avx512 = nest_source(&g, Variant::Avx512);
        assert!(avx512.contains("_mm512_fmadd_ps"), "{avx512}");
        let avx2 = nest_source(&g, Variant::Avx2);
        assert!(
            avx2.contains("_mm256_fmadd_ps") && !avx2.contains("_mm512"),
            "{avx2}"
        );
        let base = nest_source(&g, Variant::Base);
        assert!(!base.contains("_mm"), "{base}");
    }

    #[test]
    fn odd_extents_end_in_a_masked_vector_a_narrower_one_or_a_scalar() {
        // 13 columns: one whole 8-lane chunk, then 5 lanes masked, stored as 4 + 1.
        let src = nest_source(&w::matmul(4, 8, 13).expect("matmul"), Variant::Avx2);
        assert!(
            src.contains("_mm256_maskload_ps(")
                && src.contains("_mm256_setr_epi32(-1, -1, -1, -1, -1, 0, 0, 0)"),
            "{src}"
        );
        assert!(src.contains("_mm_store_ss(__q.add(4), __l)"), "{src}");
        // The accumulator's 4 rows of 13 padded to 16: the masked chunk updates it whole.
        assert!(
            src.contains("let mut acc = [(0.0f32); 64]") && src.contains("v8 * 16isize"),
            "{src}"
        );
        assert!(!src.contains("in 8isize..13isize"), "{src}");
        // 12: 8 + 4 lanes, nothing masked; 9: 8 lanes and one scalar column.
        let src = nest_source(&w::matmul(4, 8, 12).expect("matmul"), Variant::Avx2);
        assert!(
            src.contains("_mm_fmadd_ps") && !src.contains("maskload"),
            "{src}"
        );
        let src = nest_source(&w::matmul(4, 8, 9).expect("matmul"), Variant::Avx2);
        assert!(
            src.contains("in 8isize..9isize") && !src.contains("maskload"),
            "{src}"
        );
        // AVX-512: 16 whole lanes, then 14 in one masked 16-lane vector (loads, fused
        // multiply-adds and the store), the accumulator's rows padded to 32.
        let src = nest_source(&w::matmul(4, 8, 30).expect("matmul"), Variant::Avx512);
        assert!(
            src.contains("_mm512_maskz_loadu_ps(0x3fffu16, ")
                && src.contains("_mm512_mask_storeu_ps(")
                && src.contains("let mut acc = [(0.0f32); 128]")
                && !src.contains("_mm256_"),
            "{src}"
        );
        // 22: 16, then 6 lanes in a masked 8-lane vector (two-lane store last).
        let src = nest_source(&w::matmul(4, 8, 22).expect("matmul"), Variant::Avx512);
        assert!(
            src.contains("_mm512_fmadd_ps")
                && src.contains("_mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0)")
                && src.contains("_mm_store_sd(__q.add(4)")
                && !src.contains("_mm512_maskz_loadu_ps"),
            "{src}"
        );
        // 12, below one 16-lane vector: one masked 16-lane vector, not 8 + 4.
        let src = nest_source(&w::matmul(4, 8, 12).expect("matmul"), Variant::Avx512);
        assert!(
            src.contains("_mm512_maskz_loadu_ps(0x0fffu16, ") && !src.contains("_mm_fmadd_ps"),
            "{src}"
        );
    }

    #[test]
    fn filter_layout_tiles_write_back_through_transposes_with_their_epilogue() {
        use harl_te::{ops, DType, GraphBuilder};
        // A 7x7 plane (7-pixel rows) of 64 filters with bias and ReLU: the filter layout's
        // tile of 7 pixels, its write-back transposed (stores masked to 7 lanes) with the
        // ReLU computed there, no pass of its own.
        let mut b = GraphBuilder::new();
        let x = b.input("x", &[1, 64, 7, 7], DType::F32);
        let w = b.weight("w", &[64, 64, 3, 3], DType::F32);
        let p = ops::Conv2dParams {
            stride: (1, 1),
            pad: (1, 1),
            dilation: (1, 1),
            groups: 1,
        };
        let y = ops::conv2d(&mut b, x, w, p).expect("conv");
        ops::relu(&mut b, y).expect("relu");
        let g = b.finish().expect("graph");
        for variant in [Variant::Avx2, Variant::Avx512] {
            let src = nest_source(&g, variant);
            // The nest with the tile (the others copy the padded input).
            let tile = src
                .split("unsafe fn nest")
                .find(|n| n.contains("_mm256_permute2f128_ps::<0x31>(__s3, __s7)"))
                .unwrap_or_default();
            assert!(
                tile.contains("_mm256_max_ps") && tile.contains("_mm_store_sd(__q.add(4)"),
                "{src}"
            );
        }
    }

    #[test]
    fn small_padded_planes_are_read_in_place_with_masked_loads_on_avx512() {
        // 7x7 depthwise: on AVX-512 no padded copy, each tap a masked load whose lanes
        // outside the image are zero, in one nest; AVX2 keeps the copy (no mask registers).
        let g = w::depthwise_conv2d(1, 32, 7, 7, 3, 3, 1, 1, 1).expect("depthwise");
        let avx512 = nest_source(&g, Variant::Avx512);
        assert!(
            avx512.contains("_mm256_maskz_loadu_ps(")
                && avx512.contains("wrapping_offset(")
                && !avx512.contains("unsafe fn nest1")
                // The padding's lane mask joins the load's: no blend.
                && !avx512.contains("_mask_blend_ps("),
            "{avx512}"
        );
        let avx2 = nest_source(&g, Variant::Avx2);
        assert!(!avx2.contains("wrapping_offset("), "{avx2}");
        // 14x14 keeps its copy on AVX-512 too: there the copy won.
        let g = w::depthwise_conv2d(1, 32, 14, 14, 3, 3, 1, 1, 1).expect("depthwise");
        assert!(!nest_source(&g, Variant::Avx512).contains("wrapping_offset("));
        // Stride 2 to a 7x7 plane: each tap's stride-2 read is one masked 512-bit load and a
        // permute of its even elements.
        let g = w::depthwise_conv2d(1, 32, 14, 14, 3, 3, 2, 1, 1).expect("depthwise");
        let src = nest_source(&g, Variant::Avx512);
        assert!(
            src.contains("wrapping_offset(")
                && src.contains("_mm512_castps512_ps256(_mm512_permutexvar_ps("),
            "{src}"
        );
    }

    #[test]
    fn a_global_pool_is_one_vector_loop_over_its_pixels() {
        // Sum over [1, 64, 7, 7]'s pixels: the two 7-step loops fused, their parts
        // recombined into a contiguous index, 16 lanes at a time (3 vectors and a scalar).
        use harl_te::{DType, Expr, GraphBuilder, ReduceOp};
        let mut b = GraphBuilder::new();
        let x = b.input("x", &[1, 64, 7, 7], DType::F32);
        let read = harl_te::load(
            x,
            vec![Expr::axis(0), Expr::axis(1), Expr::axis(4), Expr::axis(5)],
        );
        b.reduce(
            "pool",
            &[1, 64, 1, 1],
            DType::F32,
            ReduceOp::Sum,
            &[7, 7],
            read,
        );
        let g = b.finish().expect("graph");
        let src = nest_source(&g, Variant::Avx512);
        assert_eq!(src.matches("_mm512_reduce_add_ps").count(), 3, "{src}");
        let avx2 = nest_source(&g, Variant::Avx2);
        assert!(avx2.contains("_mm_add_ps(__q, _mm_movehl_ps"), "{avx2}");
    }

    #[test]
    fn row_chains_reduce_their_lanes_horizontally() {
        let g = w::softmax(64, 256).expect("softmax");
        let avx512 = nest_source(&g, Variant::Avx512);
        for op in ["_mm512_reduce_max_ps", "_mm512_reduce_add_ps"] {
            assert!(avx512.contains(op), "{op}: {avx512}");
        }
        let avx2 = nest_source(&g, Variant::Avx2);
        assert!(
            avx2.contains("_mm256_extractf128_ps::<1>") && avx2.contains("_mm_max_ss"),
            "{avx2}"
        );
    }

    #[test]
    fn coefficients_are_exact_or_absent() {
        let v = Expr::Axis(3);
        let other = Expr::Axis(1);
        assert_eq!(
            coefficient(&(v.clone() * Expr::int(2) + other.clone()), 3),
            Some(2)
        );
        assert_eq!(coefficient(&(other.clone() * Expr::int(7)), 3), Some(0));
        // A product with another loop variable, a division: not affine with a constant.
        assert_eq!(coefficient(&(v.clone() * other), 3), None);
        assert_eq!(
            coefficient(
                &Expr::Binary(BinaryOp::Div, Box::new(v), Box::new(Expr::int(2))),
                3
            ),
            None
        );
    }
}
