//! Rust codegen for the CPU: loop programs become a module with one safe `run` function.
//!
//! A kernel is emitted once per ISA variant, each from its own schedule (a register tile that
//! fits AVX-512's 32 zmm registers spills on AVX2's 16 ymm): AVX-512, AVX2+FMA and a portable
//! baseline (with FMA on aarch64). Each variant is a submodule whose nests carry
//! `#[target_feature]`; `run` checks the slice lengths once and dispatches on the CPU detected
//! at run time, so the user's build needs no `-C target-cpu`. Multiply-adds of reductions use
//! `mul_add` only in variants with FMA (elsewhere it is a libm call). Parallel nests run their
//! outermost loop on rayon through `harl::runtime::parallel_for`.

use crate::default_schedule::CpuTarget;
use crate::loop_ir::in_bounds;
use crate::loop_ir::{LoopKind, Nest, Program, Stmt};
use harl_te::{BinaryOp, DType, Expr, Graph, ReduceOp, TensorRef, UnaryOp};
use std::fmt::Write;

/// Loops at most this long that are marked unrolled are unrolled in the source itself...
const SOURCE_UNROLL_MAX: usize = 16;

/// ...while their copies of the body stay within this many bytes of source; a longer loop
/// stays a loop (LLVM may still unroll it). Nested unrolled loops multiply: 512 copies of a
/// transposed convolution's predicated body came to 1 MB of source per candidate, and a
/// batch of such candidates ran past the measurer's 10-minute build limit (2026-12-01). The
/// innermost loops are expanded first, as they matter most for register tiles.
const SOURCE_UNROLL_BYTES: usize = 64 * 1024;

const X86: &str = "#[cfg(any(target_arch = \"x86\", target_arch = \"x86_64\"))]";

/// One ISA variant of a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// x86-64 with AVX-512F/VL, AVX2 and FMA.
    Avx512,
    /// x86-64 with AVX2 and FMA.
    Avx2,
    /// Everything else (FMA on aarch64, where NEON always has it).
    Base,
}

impl Variant {
    /// All variants, best first.
    pub const ALL: [Variant; 3] = [Variant::Avx512, Variant::Avx2, Variant::Base];

    /// The submodule name, also the label in `SCHEDULE_SOURCES`.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Avx512 => "avx512",
            Variant::Avx2 => "avx2",
            Variant::Base => "base",
        }
    }

    /// The tuning-cache ISA class whose records apply to this variant on `arch`.
    pub fn isa_class(self, arch: &str) -> String {
        match (self, arch) {
            (Variant::Avx512, _) => "x86_64-avx512".into(),
            (Variant::Avx2, _) => "x86_64-avx2".into(),
            (Variant::Base, "aarch64") => "aarch64-neon".into(),
            (Variant::Base, a) => format!("{a}-baseline"),
        }
    }

    /// What the default schedule plans for in this variant.
    pub fn cpu_target(self, arch: &str, threads: usize) -> CpuTarget {
        let (vector_bytes, acc_registers) = match (self, arch) {
            (Variant::Avx512, _) => (64, 16),
            (Variant::Avx2, _) => (32, 12),
            (Variant::Base, "aarch64") => (16, 24),
            (Variant::Base, _) => (16, 12),
        };
        CpuTarget {
            vector_bytes,
            acc_registers,
            threads,
        }
    }

    fn cfg(self) -> &'static str {
        match self {
            Variant::Base => "",
            _ => X86,
        }
    }

    fn target_feature(self) -> &'static str {
        match self {
            Variant::Avx512 => "#[target_feature(enable = \"avx512f,avx512vl,avx2,fma\")]\n",
            Variant::Avx2 => "#[target_feature(enable = \"avx2,fma\")]\n",
            Variant::Base => "",
        }
    }

    fn fma(self) -> &'static str {
        match self {
            Variant::Base => "cfg!(target_arch = \"aarch64\")",
            _ => "true",
        }
    }

    fn isa(self) -> &'static str {
        match self {
            Variant::Avx512 => "::harl::runtime::Isa::Avx512",
            Variant::Avx2 => "::harl::runtime::Isa::Avx2",
            Variant::Base => "_",
        }
    }
}

/// What the generated module is called from: names for messages and parameters.
#[derive(Clone, Debug)]
pub struct KernelMeta {
    /// The user-facing kernel name.
    pub name: String,
    /// Parameter names, one per graph input (valid Rust identifiers).
    pub params: Vec<String>,
    /// Name of the output parameter.
    pub output: String,
}

/// The lowered program of one variant and where its schedule came from.
#[derive(Clone, Debug)]
pub struct VariantProgram {
    /// Which ISA.
    pub variant: Variant,
    /// Its loop program.
    pub program: Program,
    /// Where its schedule came from, e.g. "default schedule"; readable at run time.
    pub source: String,
}

/// Emits the items of the generated module: one submodule per variant and a dispatching `run`.
/// `graph` is the kernel as declared (its inputs and output define `run`'s signature).
pub fn emit_module(graph: &Graph, variants: &[VariantProgram], meta: &KernelMeta) -> String {
    let mut out = String::new();
    let key = graph.workload_key();
    let _ = writeln!(
        out,
        "// @generated by harl-build for kernel `{}`; do not edit.",
        meta.name
    );
    let _ = writeln!(out, "/// The workload key this code was generated for.");
    let _ = writeln!(out, "pub const WORKLOAD_KEY: &str = {key:?};");
    let _ = writeln!(out, "/// Where each ISA variant's schedule came from.");
    let sources: Vec<String> = variants
        .iter()
        .map(|v| format!("({:?}, {:?})", v.variant.name(), v.source))
        .collect();
    let _ = writeln!(
        out,
        "pub const SCHEDULE_SOURCES: &[(&str, &str)] = &[{}];",
        sources.join(", ")
    );
    let _ = writeln!(
        out,
        "/// Where the schedule of the variant this CPU runs came from.\npub fn schedule_source() -> &'static str {{\n    match ::harl::runtime::Isa::detect() {{"
    );
    for v in variants {
        let _ = writeln!(
            out,
            "        {}\n        {} => {:?},",
            v.variant.cfg(),
            v.variant.isa(),
            v.source
        );
    }
    if !variants.iter().any(|v| v.variant == Variant::Base) {
        out.push_str("        _ => \"none\",\n");
    }
    out.push_str("    }\n}\n");
    for v in variants {
        emit_variant(&mut out, v, meta);
    }
    emit_run(&mut out, graph, variants, meta);
    out
}

fn signature(graph: &Graph, meta: &KernelMeta) -> String {
    let mut params: Vec<String> = meta
        .params
        .iter()
        .zip(&graph.inputs)
        .map(|(name, ph)| format!("{name}: &[{}]", ph.dtype.rust_name()))
        .collect();
    let out_ty = graph.stages.last().map_or("f32", |s| s.dtype.rust_name());
    params.push(format!("{}: &mut [{out_ty}]", meta.output));
    params.join(", ")
}

fn emit_variant(out: &mut String, v: &VariantProgram, meta: &KernelMeta) {
    let p = &v.program;
    let g = &p.graph;
    let var = v.variant;
    let _ = writeln!(out, "{}\nmod {} {{", var.cfg(), var.name());
    let _ = writeln!(out, "const FMA: bool = {};", var.fma());
    // The buffers every nest can see, as pointers that may cross threads.
    out.push_str("#[derive(Clone, Copy)]\nstruct Bufs {\n");
    for (i, ph) in g.inputs.iter().enumerate() {
        let _ = writeln!(
            out,
            "    i{i}: ::harl::runtime::SyncPtr<{}>,",
            ph.dtype.rust_name()
        );
    }
    for (s, st) in g.stages.iter().enumerate() {
        if p.has_buffer[s] {
            let _ = writeln!(
                out,
                "    s{s}: ::harl::runtime::SyncPtr<{}>,",
                st.dtype.rust_name()
            );
        }
    }
    out.push_str("}\n");
    for (n, nest) in p.nests.iter().enumerate() {
        emit_nest(out, p, n, nest, var, SOURCE_UNROLL_BYTES);
    }
    emit_variant_run(out, p, meta);
    out.push_str("}\n");
}

fn emit_nest(
    out: &mut String,
    p: &Program,
    n: usize,
    nest: &Nest,
    var: Variant,
    unroll_bytes: usize,
) {
    let mut cx = Cx {
        p,
        out: String::new(),
        depth: 1,
        stage: nest.stage,
        unroll_bytes,
    };
    match nest.body.as_slice() {
        [Stmt::For {
            var,
            kind: LoopKind::Parallel,
            body,
            ..
        }] => {
            cx.line(&format!("let v{var}: isize = v0 as isize;"));
            cx.stmts(body);
        }
        stmts => cx.stmts(stmts),
    }
    let body = cx.out;
    let _ = write!(
        out,
        "{}unsafe fn nest{n}(b: Bufs, v0: usize) {{
    let _ = v0;
    // SAFETY: lowering proved every unchecked index in bounds for the buffer lengths that `run`
    // checked, and parallel iterations write disjoint elements.
    unsafe {{
{body}    }}
}}
",
        var.target_feature()
    );
}

/// The variant's `run`: allocates intermediates and runs the nests. Unsafe: the caller checked
/// the slice lengths and that the CPU supports the variant.
fn emit_variant_run(out: &mut String, p: &Program, meta: &KernelMeta) {
    let g = &p.graph;
    let last = g.stages.len() - 1;
    let _ = writeln!(
        out,
        "#[allow(clippy::too_many_arguments)]\npub(super) unsafe fn run({}) {{",
        signature(g, meta)
    );
    // Buffers are filled before any nest runs: each is written only by its own nest.
    for (s, st) in g.stages.iter().enumerate() {
        if !p.has_buffer[s] {
            continue;
        }
        let fill = p
            .nests
            .iter()
            .find(|n| n.stage == s)
            .and_then(|n| n.fill)
            .map(|v| const_lit(v, st.dtype));
        if s == last {
            if let Some(v) = fill {
                let _ = writeln!(out, "    {}.fill({v});", meta.output);
            }
        } else {
            let init = fill.unwrap_or_else(|| const_lit(0.0, st.dtype));
            let _ = writeln!(
                out,
                "    let mut __harl_s{s} = ::std::vec![{init}; {}];",
                st.size()
            );
        }
    }
    out.push_str("    let __harl_b = Bufs {\n");
    for (i, name) in meta.params.iter().enumerate() {
        let ty = g.inputs[i].dtype.rust_name();
        let _ = writeln!(
            out,
            "        i{i}: ::harl::runtime::SyncPtr({name}.as_ptr() as *mut {ty}),"
        );
    }
    for s in 0..g.stages.len() {
        if p.has_buffer[s] {
            let buf = if s == last {
                meta.output.clone()
            } else {
                format!("__harl_s{s}")
            };
            let _ = writeln!(
                out,
                "        s{s}: ::harl::runtime::SyncPtr({buf}.as_mut_ptr()),"
            );
        }
    }
    out.push_str("    };\n");
    for (n, nest) in p.nests.iter().enumerate() {
        match nest.body.as_slice() {
            [Stmt::For {
                extent,
                kind: LoopKind::Parallel,
                ..
            }] => {
                let _ = writeln!(
                    out,
                    "    // SAFETY: iterations of a parallel loop write disjoint elements (spatial loops only).\n    ::harl::runtime::parallel_for({extent}, |__harl_v| unsafe {{ nest{n}(__harl_b, __harl_v) }});"
                );
            }
            _ => {
                let _ = writeln!(
                    out,
                    "    // SAFETY: the buffers behind `__harl_b` have the lengths `super::run` checked.\n    unsafe {{ nest{n}(__harl_b, 0) }};"
                );
            }
        }
    }
    out.push_str("}\n");
}

/// The safe entry point: checks lengths, then runs the best variant this CPU supports.
fn emit_run(out: &mut String, g: &Graph, variants: &[VariantProgram], meta: &KernelMeta) {
    let _ = writeln!(
        out,
        "/// Runs the kernel; checks every slice length first.\n#[allow(clippy::too_many_arguments)]\npub fn run({}) -> ::core::result::Result<(), ::harl::KernelError> {{",
        signature(g, meta)
    );
    let mut check = |arg: &str, shape: &[usize]| {
        let want: usize = shape.iter().product();
        let _ = writeln!(
            out,
            "    if {arg}.len() != {want} {{ return Err(::harl::KernelError::Length {{ kernel: {:?}, arg: {arg:?}, got: {arg}.len(), want: {want}, shape: {:?} }}); }}",
            meta.name,
            format!("{shape:?}")
        );
    };
    for (name, ph) in meta.params.iter().zip(&g.inputs) {
        check(name, &ph.shape);
    }
    if let Some(last) = g.stages.last() {
        check(&meta.output, &last.shape);
    }
    let mut args: Vec<&str> = meta.params.iter().map(String::as_str).collect();
    args.push(&meta.output);
    let args = args.join(", ");
    out.push_str("    match ::harl::runtime::Isa::detect() {\n");
    for v in variants {
        let _ = writeln!(
            out,
            "        {}\n        // SAFETY: lengths checked above; the variant matches the detected CPU.\n        {} => unsafe {{ {}::run({args}) }},",
            v.variant.cfg(),
            v.variant.isa(),
            v.variant.name()
        );
    }
    if !variants.iter().any(|v| v.variant == Variant::Base) {
        // A module with only some variants (the measurer builds the host's alone) reports a CPU
        // it has no code for instead of failing to compile.
        let _ = writeln!(
            out,
            "        #[allow(unreachable_patterns)]\n        _ => return Err(::harl::KernelError::UnsupportedCpu {{ kernel: {:?} }}),",
            meta.name
        );
    }
    out.push_str("    }\n    Ok(())\n}\n");
}

/// The value class of an emitted expression.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ty {
    /// Index arithmetic, as `isize` (no overflow at the validated sizes).
    Idx,
    /// A value of this type.
    Val(DType),
}

struct Cx<'a> {
    p: &'a Program,
    out: String,
    depth: usize,
    stage: usize,
    /// Most bytes of source one unrolled loop may expand to ([`SOURCE_UNROLL_BYTES`]).
    unroll_bytes: usize,
}

impl Cx<'_> {
    fn line(&mut self, s: &str) {
        for _ in 0..self.depth + 1 {
            self.out.push_str("    ");
        }
        self.out.push_str(s);
        self.out.push('\n');
    }

    fn stmts(&mut self, stmts: &[Stmt]) {
        for s in stmts {
            self.stmt(s);
        }
    }

    fn stmt(&mut self, s: &Stmt) {
        match s {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => {
                // The body's text does not depend on the iteration (each copy binds `v{var}`
                // itself), so it is emitted once and copied.
                let outer = std::mem::take(&mut self.out);
                self.depth += 1;
                self.stmts(body);
                self.depth -= 1;
                let text = std::mem::replace(&mut self.out, outer);
                let unroll = *kind == LoopKind::Unrolled
                    && *extent <= SOURCE_UNROLL_MAX
                    && extent * text.len() <= self.unroll_bytes;
                if unroll {
                    for i in 0..*extent {
                        self.line(&format!("{{ let v{var}: isize = {i};"));
                        self.out.push_str(&text);
                        self.line("}");
                    }
                } else {
                    self.line(&format!("for v{var} in 0..{extent}isize {{"));
                    self.out.push_str(&text);
                    self.line("}");
                }
            }
            Stmt::Let { var, value } => {
                let v = self.idx(value);
                self.line(&format!("let v{var}: isize = {v};"));
            }
            Stmt::If { cond, body } => {
                let (c, _) = self.expr(cond);
                self.line(&format!("if {c} {{"));
                self.depth += 1;
                self.stmts(body);
                self.depth -= 1;
                self.line("}");
            }
            Stmt::Store {
                stage,
                index,
                value,
                combine,
            } => {
                let dtype = self.p.graph.stages[*stage].dtype;
                let ptr = format!(
                    "b.s{stage}.0.add({})",
                    self.flat(TensorRef::Stage(*stage), index)
                );
                match combine {
                    None => {
                        let v = self.value_as(value, dtype);
                        self.line(&format!("*{ptr} = {v};"));
                    }
                    Some(op) => {
                        let v = self.combine(*op, "(*__p)", value, dtype);
                        self.line(&format!("{{ let __p = {ptr}; *__p = {v}; }}"));
                    }
                }
            }
            // On the CPU the reads stay global: a cache-sized box gains nothing from a copy.
            Stmt::Shared { body, .. } => self.stmts(body),
            Stmt::AccDecl { size, dtype, init } => {
                let init = const_lit(*init, *dtype);
                self.line(&format!("let mut acc = [{init}; {size}];"));
            }
            Stmt::AccUpdate { index, op, value } => {
                let dtype = self.p.graph.stages[self.stage].dtype;
                let i = self.idx(index);
                let v = self.combine(*op, "(*__a)", value, dtype);
                self.line(&format!(
                    "{{ let __a = acc.get_unchecked_mut(({i}) as usize); *__a = {v}; }}"
                ));
            }
            Stmt::AccStore {
                index,
                stage,
                dest,
                combine,
            } => {
                let i = self.idx(index);
                let ptr = format!(
                    "b.s{stage}.0.add({})",
                    self.flat(TensorRef::Stage(*stage), dest)
                );
                let a = format!("*acc.get_unchecked(({i}) as usize)");
                let v = match combine {
                    None => a,
                    Some(op) => combine_str(*op, "(*__p)", &a),
                };
                self.line(&format!("{{ let __p = {ptr}; *__p = {v}; }}"));
            }
        }
    }

    /// `op(cur, value)`, contracting a sum of products into a multiply-add.
    fn combine(&mut self, op: ReduceOp, cur: &str, value: &Expr, dtype: DType) -> String {
        if let (ReduceOp::Sum, Expr::Binary(BinaryOp::Mul, x, y), true) =
            (op, value, dtype.is_float())
        {
            let x = self.value_as(x, dtype);
            let y = self.value_as(y, dtype);
            return format!(
                "::harl::runtime::madd_{}::<FMA>({x}, {y}, {cur})",
                dtype.rust_name()
            );
        }
        let v = self.value_as(value, dtype);
        combine_str(op, cur, &v)
    }

    /// Row-major flat offset of `index` into tensor `t`, as a usize expression.
    fn flat(&mut self, t: TensorRef, index: &[Expr]) -> String {
        let shape = self.p.graph.shape(t).to_vec();
        let mut terms = Vec::new();
        let mut stride = 1usize;
        for (d, e) in index.iter().enumerate().rev() {
            let i = self.idx(e);
            terms.push(if stride == 1 {
                i
            } else {
                format!("{i} * {stride}")
            });
            stride *= shape[d];
        }
        terms.reverse();
        format!("({}) as usize", terms.join(" + "))
    }

    fn idx(&mut self, e: &Expr) -> String {
        let (s, ty) = self.expr(e);
        match ty {
            Ty::Idx => s,
            _ => format!("({s} as isize)"),
        }
    }

    fn value_as(&mut self, e: &Expr, dtype: DType) -> String {
        let (s, ty) = self.expr(e);
        match ty {
            Ty::Val(d) if d == dtype => s,
            _ => format!("({s} as {})", dtype.rust_name()),
        }
    }

    fn expr(&mut self, e: &Expr) -> (String, Ty) {
        match e {
            Expr::Const(v, DType::I32) => (format!("{}isize", *v as i64), Ty::Idx),
            Expr::Const(v, d) => (const_lit(*v, *d), Ty::Val(*d)),
            Expr::Axis(v) => (format!("v{v}"), Ty::Idx),
            Expr::Load(t, idx) => self.load(*t, idx),
            Expr::Unary(op, a) => {
                let (x, ty) = self.expr(a);
                let s = match (op, ty) {
                    (UnaryOp::Neg, Ty::Val(DType::I32)) => format!("{x}.wrapping_neg()"),
                    (UnaryOp::Abs, Ty::Val(DType::I32)) => format!("{x}.wrapping_abs()"),
                    (UnaryOp::Neg, _) => format!("(-{x})"),
                    (UnaryOp::Not, _) => format!("(!{x})"),
                    (UnaryOp::Abs, _) => format!("{x}.abs()"),
                    (UnaryOp::Exp, _) => format!("{x}.exp()"),
                    (UnaryOp::Log, _) => format!("{x}.ln()"),
                    (UnaryOp::Sqrt, _) => format!("{x}.sqrt()"),
                    (UnaryOp::Tanh, _) => format!("{x}.tanh()"),
                    (UnaryOp::Erf, Ty::Val(d)) => {
                        format!("::harl::runtime::erf_{}({x})", d.rust_name())
                    }
                    (UnaryOp::Erf, Ty::Idx) => format!("::harl::runtime::erf_f32({x} as f32)"),
                };
                (s, ty)
            }
            Expr::Binary(op, a, b) => {
                let (x, tx) = self.expr(a);
                let (y, ty) = self.expr(b);
                let (x, y, t) = unify(x, tx, y, ty);
                let s = match (op, t) {
                    (BinaryOp::Add, Ty::Val(DType::I32)) => format!("{x}.wrapping_add({y})"),
                    (BinaryOp::Sub, Ty::Val(DType::I32)) => format!("{x}.wrapping_sub({y})"),
                    (BinaryOp::Mul, Ty::Val(DType::I32)) => format!("{x}.wrapping_mul({y})"),
                    (BinaryOp::Div, Ty::Val(DType::I32)) => format!("{x}.wrapping_div({y})"),
                    (BinaryOp::Rem, Ty::Val(DType::I32)) => format!("{x}.wrapping_rem({y})"),
                    (BinaryOp::Add, _) => format!("({x} + {y})"),
                    (BinaryOp::Sub, _) => format!("({x} - {y})"),
                    (BinaryOp::Mul, _) => format!("({x} * {y})"),
                    (BinaryOp::Div, _) => format!("({x} / {y})"),
                    (BinaryOp::Rem, _) => format!("({x} % {y})"),
                    (BinaryOp::Min, _) => format!("{x}.min({y})"),
                    (BinaryOp::Max, _) => format!("{x}.max({y})"),
                    (BinaryOp::And, _) => format!("({x} && {y})"),
                    (BinaryOp::Or, _) => format!("({x} || {y})"),
                };
                (s, t)
            }
            Expr::Cmp(op, a, b) => {
                let (x, tx) = self.expr(a);
                let (y, ty) = self.expr(b);
                let (x, y, _) = unify(x, tx, y, ty);
                (format!("({x} {} {y})", op.symbol()), Ty::Val(DType::Bool))
            }
            Expr::Select(c, a, b) => {
                let (c, _) = self.expr(c);
                let (x, tx) = self.expr(a);
                let (y, ty) = self.expr(b);
                let (x, y, t) = unify(x, tx, y, ty);
                (format!("(if {c} {{ {x} }} else {{ {y} }})"), t)
            }
            Expr::Cast(d, a) => {
                let (x, _) = self.expr(a);
                (format!("({x} as {})", d.rust_name()), Ty::Val(*d))
            }
        }
    }

    /// A load; unchecked when interval analysis proves every index in bounds, else checked with
    /// a zero for out-of-bounds (only reachable under a select the graph guards).
    fn load(&mut self, t: TensorRef, idx: &[Expr]) -> (String, Ty) {
        let shape = self.p.graph.shape(t).to_vec();
        let dtype = self.p.graph.dtype(t);
        let base = match t {
            TensorRef::Input(i) => format!("b.i{i}.0"),
            TensorRef::Stage(s) => format!("b.s{s}.0"),
        };
        let provable = in_bounds(idx, &shape, &self.p.var_extents);
        if provable {
            let flat = self.flat(t, idx);
            return (format!("(*{base}.add({flat}))"), Ty::Val(dtype));
        }
        let names: Vec<String> = (0..idx.len()).map(|d| format!("__c{d}")).collect();
        let values: Vec<String> = idx.iter().map(|e| self.idx(e)).collect();
        let conds: Vec<String> = names
            .iter()
            .zip(&shape)
            .map(|(n, d)| format!("{n} >= 0 && {n} < {d}"))
            .collect();
        let flat: Vec<String> = {
            let mut stride = 1usize;
            let mut v = Vec::new();
            for (d, n) in names.iter().enumerate().rev() {
                v.push(format!("{n} * {stride}"));
                stride *= shape[d];
            }
            v
        };
        (
            format!(
                "{{ let ({},) = ({},); if {} {{ *{base}.add(({}) as usize) }} else {{ {} }} }}",
                names.join(", "),
                values.join(", "),
                conds.join(" && "),
                flat.join(" + "),
                const_lit(0.0, dtype)
            ),
            Ty::Val(dtype),
        )
    }
}

/// Brings two operands to one type: an index meeting an i32 value becomes an i32.
fn unify(x: String, tx: Ty, y: String, ty: Ty) -> (String, String, Ty) {
    match (tx, ty) {
        (Ty::Idx, Ty::Val(d)) => (format!("({x} as {})", d.rust_name()), y, Ty::Val(d)),
        (Ty::Val(d), Ty::Idx) => (x, format!("({y} as {})", d.rust_name()), Ty::Val(d)),
        _ => (x, y, tx),
    }
}

fn combine_str(op: ReduceOp, cur: &str, v: &str) -> String {
    match op {
        ReduceOp::Sum => format!("{cur} + {v}"),
        ReduceOp::Max => format!("{cur}.max({v})"),
        ReduceOp::Min => format!("{cur}.min({v})"),
    }
}

/// A Rust literal of `dtype` for `v`.
pub fn const_lit(v: f64, dtype: DType) -> String {
    let ty = dtype.rust_name();
    match dtype {
        DType::Bool => (v != 0.0).to_string(),
        // `as` saturates; graph validation rejects i32 constants out of range, so this only
        // keeps a literal that rustc accepts.
        DType::I32 => format!("({}i32)", v as i32),
        // Decide on the value in the stage's type: an f64 that overflows f32 is an infinity
        // there, and `{:?}` of it would print `inf`, which is no Rust literal.
        DType::F32 => float_lit(f64::from(v as f32), ty),
        DType::F64 => float_lit(v, ty),
    }
}

fn float_lit(v: f64, ty: &str) -> String {
    match v {
        _ if v.is_nan() => format!("{ty}::NAN"),
        f64::INFINITY => format!("{ty}::INFINITY"),
        f64::NEG_INFINITY => format!("{ty}::NEG_INFINITY"),
        _ if ty == "f32" => format!("({:?}f32)", v as f32),
        _ => format!("({v:?}f64)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::default_schedule::default_schedule;
    use crate::lower::lower;
    use harl_te::ops::workloads as w;

    /// The default schedule's nest of a GEMM (its register-tile rows are marked unrolled),
    /// emitted under an unroll budget of `unroll_bytes`.
    fn gemm_nest(unroll_bytes: usize) -> String {
        let g = w::matmul(64, 64, 64).expect("matmul");
        let target = Variant::Avx2.cpu_target("x86_64", 1);
        let p = lower(&g, &default_schedule(&g, &target)).expect("lowers");
        let mut out = String::new();
        emit_nest(&mut out, &p, 0, &p.nests[0], Variant::Avx2, unroll_bytes);
        out
    }

    #[test]
    fn literals_are_rust_literals_whatever_their_value() {
        assert_eq!(const_lit(1e39, DType::F32), "f32::INFINITY");
        assert_eq!(const_lit(-1e39, DType::F32), "f32::NEG_INFINITY");
        assert_eq!(const_lit(f64::NAN, DType::F32), "f32::NAN");
        assert_eq!(const_lit(1e39, DType::F64), "(1e39f64)");
        assert_eq!(const_lit(0.5, DType::F32), "(0.5f32)");
        assert_eq!(const_lit(1e12, DType::I32), format!("({}i32)", i32::MAX));
        assert_eq!(const_lit(-3.0, DType::I32), "(-3i32)");
    }

    #[test]
    fn unrolled_loops_past_the_byte_budget_stay_loops() {
        let unrolled = gemm_nest(SOURCE_UNROLL_BYTES);
        let rolled = gemm_nest(0);
        // An unrolled copy opens a block binding its loop index to a constant.
        let copies = |s: &str| s.matches("{ let v").count();
        // Within the budget each row of the register tile is a copy...
        assert!(copies(&unrolled) >= 2, "{unrolled}");
        // ...past it the row loops are `for` loops again, over the same body, and the
        // source shrinks.
        assert_eq!(copies(&rolled), 0, "{rolled}");
        assert!(rolled.len() < unrolled.len());
    }
}
