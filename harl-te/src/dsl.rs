//! The kernel DSL: parses a `#[harl::kernel]` item into a te graph, with spans for every error.
//!
//! ```text
//! #[harl::kernel(M = 64, K = 128, N = 256)]
//! pub fn dense_relu(a: Tensor<f32, M, K>, w: Tensor<f32, K, N>, bias: Tensor<f32, N>)
//!     -> Tensor<f32, M, N>
//! {
//!     let mm = compute([M, N], |i, j| sum(K, |k| a[[i, k]] * w[[k, j]]));
//!     compute([M, N], |i, j| max(mm[[i, j]] + bias[j], 0.0))
//! }
//! ```
//! A parameter typed `Weight<f32, ..>` instead of `Tensor<f32, ..>` is a weight: its values stay
//! the same over many calls, so the generated `prepare` may do the work that depends on weights
//! alone once (see [`crate::graph::Placeholder::constant`]).
//! The body is `let` bindings and a final tensor expression. Tensor expressions are names,
//! `compute(shape, |axes| scalar)`, op-library calls with builder-style options
//! (`conv2d(x, w).stride(2).pad(1)`, `matmul(a, b).transpose_b()`), elementwise functions
//! (`relu`, `gelu`, `tanh`, `sigmoid`, `exp`) and `+ - * /` with broadcasting. Scalar expressions
//! index tensors with `t[[i, j]]` (or `t[i]`), use `+ - * / %`, comparisons, `&&`, `||`, `!`,
//! `max/min/exp/log/sqrt/tanh/erf/abs`, `select(c, a, b)` or `if c { a } else { b }`, `as`
//! casts, and at the top of a compute body one reduction: `sum(K, |k| ..)`,
//! `reduce_max([R, S], |r, s| ..)`, `reduce_min(..)`.

use crate::expr::{BinaryOp, CmpOp, DType, Expr, TensorRef, UnaryOp};
use crate::graph::{exact_interval, Graph, GraphBuilder, GraphError, ReduceOp};
use crate::limits::{
    checked_product, MAX_DOMAIN, MAX_EXPR_DEPTH, MAX_EXTENT, MAX_KERNEL_TOKENS, MAX_PUNCT_RUN,
    MAX_RANK, MAX_TENSOR_ELEMS, MAX_TOKEN_NESTING,
};
use crate::ops::{self, Activation, Conv1dParams, Conv2dParams, Conv3dParams};
use proc_macro2::{Span, TokenStream};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use syn::ext::IdentExt;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Error, Result};

/// A kernel parameter (an input tensor).
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    /// The parameter's name, without any `r#` prefix (`r#type` is `type`): it may be a Rust
    /// keyword, so emit it as an identifier only through [`syn::Ident::new_raw`] or by position.
    pub name: String,
    /// Static shape.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
    /// Declared `Weight<..>`: values that stay the same over many calls
    /// ([`crate::graph::Placeholder::constant`]).
    pub constant: bool,
}

/// A parsed kernel declaration.
#[derive(Clone, Debug)]
pub struct KernelDecl {
    /// The function's name, without any `r#` prefix.
    pub name: String,
    /// Inputs, in order (the graph's placeholders).
    pub params: Vec<Param>,
    /// Output shape.
    pub out_shape: Vec<usize>,
    /// Output element type.
    pub out_dtype: DType,
    /// The te graph; its last stage is the output.
    pub graph: Graph,
}

impl KernelDecl {
    /// The name of the file the build script generates for this kernel under `OUT_DIR/harl/`
    /// and the macro includes: `kernel_<name>_<workload key>.rs`. A name over 64 characters is
    /// cut there and followed by a hash of the whole name, so that a long one stays within
    /// file-name limits and two long names that share a prefix still get two files.
    pub fn generated_file(&self) -> String {
        const KEEP: usize = 64;
        let key = self.graph.workload_key();
        if self.name.chars().count() <= KEEP {
            return format!("kernel_{}_{key}.rs", self.name);
        }
        let cut: String = self.name.chars().take(KEEP).collect();
        // FNV-1a: stable across Rust versions, unlike std's hasher.
        let hash = self.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        format!("kernel_{cut}_{hash:016x}_{key}.rs")
    }

    /// A name for the output parameter that does not clash with the inputs.
    pub fn output_name(&self) -> String {
        let mut name = "out".to_string();
        while self.params.iter().any(|p| p.name == name) {
            name.push('_');
        }
        name
    }
}

/// Whether an attribute is `#[harl::kernel]` or `#[kernel]` (with or without arguments).
pub fn is_kernel_attr(attr: &syn::Attribute) -> bool {
    let path = attr.path();
    let segs: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
    matches!(segs.as_slice(), [h, k] if h == "harl" && k == "kernel") || segs == ["kernel"]
}

/// Checks an item's tokens against [`MAX_KERNEL_TOKENS`], [`MAX_TOKEN_NESTING`] and
/// [`MAX_PUNCT_RUN`] before syn parses them: syn's parser recurses once per group and per unary
/// operator, so a hostile item could overflow the stack of the proc macro (or build script)
/// before any check of ours runs. Walks with an explicit stack for the same reason.
pub fn check_token_limits(tokens: &TokenStream) -> Result<()> {
    use proc_macro2::TokenTree;
    let mut stack = vec![tokens.clone().into_iter()];
    let (mut count, mut run) = (0usize, 0usize);
    while let Some(top) = stack.last_mut() {
        let Some(tt) = top.next() else {
            stack.pop();
            continue;
        };
        count += 1;
        if count > MAX_KERNEL_TOKENS {
            return Err(Error::new(
                tt.span(),
                format!("this kernel has more than {MAX_KERNEL_TOKENS} tokens (harl_te::limits::MAX_KERNEL_TOKENS)"),
            ));
        }
        match tt {
            TokenTree::Group(g) => {
                run = 0;
                if stack.len() >= MAX_TOKEN_NESTING {
                    return Err(Error::new(
                        g.span(),
                        format!("brackets nested deeper than {MAX_TOKEN_NESTING} levels (harl_te::limits::MAX_TOKEN_NESTING)"),
                    ));
                }
                stack.push(g.stream().into_iter());
            }
            TokenTree::Punct(p) => {
                run += 1;
                if run > MAX_PUNCT_RUN {
                    return Err(Error::new(
                        p.span(),
                        format!("more than {MAX_PUNCT_RUN} operators in a row (harl_te::limits::MAX_PUNCT_RUN)"),
                    ));
                }
            }
            _ => run = 0,
        }
    }
    Ok(())
}

/// Parses a kernel from its attribute arguments and item.
pub fn parse_kernel(attr_args: TokenStream, item: &syn::ItemFn) -> Result<KernelDecl> {
    let consts = parse_consts(attr_args)?;
    let sig = &item.sig;
    if let Some(t) = &sig.asyncness {
        return Err(Error::new_spanned(t, "a harl kernel cannot be `async`"));
    }
    if let Some(t) = &sig.unsafety {
        return Err(Error::new_spanned(
            t,
            "a harl kernel is safe to call; remove `unsafe`",
        ));
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        return Err(Error::new_spanned(&sig.generics,
            "a harl kernel has static shapes and no generics; bind sizes in the attribute, e.g. `#[harl::kernel(N = 64)]`",
        ));
    }
    let mut cx = Cx {
        consts,
        tensors: HashMap::new(),
        b: GraphBuilder::new(),
        extents: Vec::new(),
        out_of_bounds: Default::default(),
        literals: Default::default(),
        depth: Cell::new(0),
    };
    let mut params = Vec::new();
    for input in &sig.inputs {
        let syn::FnArg::Typed(pt) = input else {
            return Err(Error::new_spanned(input, "a harl kernel takes no `self`"));
        };
        let syn::Pat::Ident(id) = &*pt.pat else {
            return Err(Error::new_spanned(
                &pt.pat,
                "kernel parameters must be plain names",
            ));
        };
        let name = name_of(&id.ident);
        let constant = is_weight_type(&pt.ty);
        let (dtype, shape) = cx.tensor_type(&pt.ty)?;
        if cx.tensors.contains_key(&name) {
            return Err(Error::new_spanned(
                &id.ident,
                format!("parameter `{name}` is declared twice"),
            ));
        }
        let t = if constant {
            cx.b.weight(&name, &shape, dtype)
        } else {
            cx.b.input(&name, &shape, dtype)
        };
        cx.tensors.insert(name.clone(), t);
        params.push(Param {
            name,
            shape,
            dtype,
            constant,
        });
    }
    let syn::ReturnType::Type(_, ret_ty) = &sig.output else {
        return Err(Error::new_spanned(
            &sig.ident,
            "a harl kernel returns its output tensor: add `-> Tensor<f32, ...>`",
        ));
    };
    if is_weight_type(ret_ty) {
        return Err(Error::new_spanned(
            ret_ty,
            "a kernel's output is a `Tensor<..>`; `Weight<..>` marks inputs only",
        ));
    }
    let (out_dtype, out_shape) = cx.tensor_type(ret_ty)?;
    let name = name_of(&sig.ident);
    let mut tail = None;
    for stmt in &item.block.stmts {
        match stmt {
            syn::Stmt::Local(local) => {
                let syn::Pat::Ident(id) = &local.pat else {
                    return Err(Error::new_spanned(
                        &local.pat,
                        "bind a tensor to a plain name: `let x = ...;`",
                    ));
                };
                let Some(init) = &local.init else {
                    return Err(Error::new_spanned(local, "`let` needs a value"));
                };
                let let_name = name_of(&id.ident);
                // No shadowing: one name, one tensor, so a later read cannot mean two things.
                if cx.tensors.contains_key(&let_name) {
                    return Err(Error::new_spanned(
                        &id.ident,
                        format!("`{let_name}` is already bound; kernels do not shadow, pick another name"),
                    ));
                }
                let t = cx.tensor(&init.expr, &let_name)?;
                cx.tensors.insert(let_name, t);
            }
            syn::Stmt::Expr(e, None) if tail.is_none() => tail = Some(e),
            other => return Err(Error::new_spanned(
                other,
                "a kernel body is `let` bindings and one final tensor expression (no `;` after it)",
            )),
        }
    }
    let Some(tail) = tail else {
        return Err(Error::new_spanned(
            &item.block,
            "the kernel body must end with the output tensor expression",
        ));
    };
    let mut out = cx.tensor(tail, &name)?;
    // The output must be the last stage: copy a parameter or an earlier stage if returned.
    if out != cx.b.graph().output()
        || matches!(out, TensorRef::Input(_))
        || cx.b.graph().stages.is_empty()
    {
        let shape = cx.b.shape(out);
        let idx: Vec<Expr> = (0..shape.len()).map(Expr::Axis).collect();
        out =
            cx.b.compute(&name, &shape, cx.b.dtype(out), Expr::Load(out, idx));
    }
    let (got_shape, got_dtype) = (cx.b.shape(out), cx.b.dtype(out));
    if got_shape != out_shape || got_dtype != out_dtype {
        return Err(Error::new_spanned(
            ret_ty,
            format!(
                "the body computes {} {got_shape:?}, but the signature returns {} {out_shape:?}",
                got_dtype.rust_name(),
                out_dtype.rust_name()
            ),
        ));
    }
    let graph =
        cx.b.finish()
            .map_err(|e| Error::new_spanned(tail, format!("invalid kernel: {e}")))?;
    Ok(KernelDecl {
        name,
        params,
        out_shape,
        out_dtype,
        graph,
    })
}

fn parse_consts(args: TokenStream) -> Result<HashMap<String, usize>> {
    let mut consts = HashMap::new();
    if args.is_empty() {
        return Ok(consts);
    }
    let parser = Punctuated::<syn::MetaNameValue, syn::Token![,]>::parse_terminated;
    let list = parser.parse2(args)?;
    for nv in list {
        let Some(ident) = nv.path.get_ident() else {
            return Err(Error::new_spanned(
                &nv.path,
                "expected a size name such as `N = 64`",
            ));
        };
        let value = match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Int(i),
                ..
            }) => i.base10_parse::<usize>()?,
            other => {
                return Err(Error::new_spanned(
                    other,
                    "a size must be a positive integer literal",
                ));
            }
        };
        if value == 0 {
            return Err(Error::new_spanned(&nv.value, "a size must be at least 1"));
        }
        if value > MAX_TENSOR_ELEMS {
            return Err(Error::new_spanned(
                &nv.value,
                format!(
                    "a size must be at most {MAX_TENSOR_ELEMS} (harl_te::limits::MAX_TENSOR_ELEMS)"
                ),
            ));
        }
        if consts.insert(name_of(ident), value).is_some() {
            return Err(Error::new_spanned(
                ident,
                format!("size `{ident}` is bound twice"),
            ));
        }
    }
    Ok(consts)
}

struct Cx {
    consts: HashMap<String, usize>,
    tensors: HashMap<String, TensorRef>,
    b: GraphBuilder,
    /// Axis extents of the compute being parsed, for bounds checks with a span.
    extents: Vec<usize>,
    /// The first access that may leave its tensor, reported if validation agrees.
    out_of_bounds: RefCell<Option<TokenStream>>,
    /// Literals (and sizes used as values) with their tokens, so that validation's
    /// [`GraphError::BadConst`] (known only once the literal's type is) can point at one.
    literals: RefCell<Vec<(f64, TokenStream)>>,
    /// Nesting of the recursive parse, bounded by [`MAX_EXPR_DEPTH`].
    depth: Cell<usize>,
}

/// One level of the recursive parse; the level is left when this drops.
struct Level<'a>(&'a Cell<usize>);

impl Drop for Level<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

/// Options collected from a builder-style chain: `.stride(2).pad(1)`.
#[derive(Default)]
struct Options(Vec<(String, Vec<syn::Expr>, Span)>);

/// Whether a parameter's type is `Weight<..>`.
fn is_weight_type(ty: &syn::Type) -> bool {
    matches!(ty, syn::Type::Path(tp) if tp.path.segments.last().is_some_and(|s| s.ident == "Weight"))
}

impl Cx {
    /// `Tensor<f32, M, 64>` (or `Weight<f32, M, 64>`) -> (f32, [M, 64]).
    fn tensor_type(&self, ty: &syn::Type) -> Result<(DType, Vec<usize>)> {
        let help = "expected `Tensor<dtype, dims...>` (or `Weight<dtype, dims...>` for an input whose values stay the same over many calls), e.g. `Tensor<f32, 64, N>`";
        let syn::Type::Path(tp) = ty else {
            return Err(Error::new_spanned(ty, help));
        };
        let Some(seg) = tp
            .path
            .segments
            .last()
            .filter(|s| s.ident == "Tensor" || s.ident == "Weight")
        else {
            return Err(Error::new_spanned(ty, help));
        };
        let syn::PathArguments::AngleBracketed(args) = &seg.arguments else {
            return Err(Error::new_spanned(seg, help));
        };
        let mut it = args.args.iter();
        let first = it.next();
        let dtype = match first {
            Some(syn::GenericArgument::Type(syn::Type::Path(p))) => p
                .path
                .get_ident()
                .and_then(|i| DType::from_rust_name(&i.to_string()))
                .filter(|d| *d != DType::Bool),
            _ => None,
        }
        .ok_or_else(|| match first {
            Some(t) => Error::new_spanned(
                t,
                format!(
                    "unsupported element type `{}`: a Tensor holds f32, f64 or i32",
                    quote::ToTokens::to_token_stream(t)
                ),
            ),
            None => Error::new_spanned(
                args,
                "`Tensor` needs an element type first: f32, f64 or i32",
            ),
        })?;
        let mut shape = Vec::new();
        for a in it {
            let dim = match a {
                syn::GenericArgument::Const(e) => self.size(e)?,
                syn::GenericArgument::Type(syn::Type::Path(p)) if p.path.get_ident().is_some() => {
                    let id = p.path.get_ident().map(name_of).unwrap_or_default();
                    let n = self.const_named(&id, a.span())?;
                    if n > MAX_EXTENT {
                        return Err(Error::new_spanned(
                            a,
                            format!("a dimension of {n} is over the limit of {MAX_EXTENT} (harl_te::limits::MAX_EXTENT)"),
                        ));
                    }
                    n
                }
                other => {
                    return Err(Error::new_spanned(
                        other,
                        "a dimension is an integer or a size name",
                    ))
                }
            };
            shape.push(dim);
        }
        if shape.is_empty() {
            return Err(Error::new_spanned(
                args,
                "a tensor needs at least one dimension (0-d tensors are not supported; a scalar is `Tensor<f32, 1>`)",
            ));
        }
        check_shape(args, &shape, "tensor")?;
        Ok((dtype, shape))
    }

    /// Enters one level of the recursive parse, or errors past [`MAX_EXPR_DEPTH`].
    fn enter(&self, span: Span) -> Result<Level<'_>> {
        let d = self.depth.get() + 1;
        if d > MAX_EXPR_DEPTH {
            return Err(Error::new(
                span,
                format!("expression nested deeper than {MAX_EXPR_DEPTH} levels (harl_te::limits::MAX_EXPR_DEPTH)"),
            ));
        }
        self.depth.set(d);
        Ok(Level(&self.depth))
    }

    fn const_named(&self, name: &str, span: Span) -> Result<usize> {
        self.consts.get(name).copied().ok_or_else(|| {
            Error::new(
                span,
                format!("unknown size `{name}`: bind it in the attribute, e.g. `#[harl::kernel({name} = 64)]`"),
            )
        })
    }

    /// A compile-time size: a literal, a size name, or `+ - * /` of those.
    fn size(&self, e: &syn::Expr) -> Result<usize> {
        let v = self.size_i(e)?;
        if v <= 0 {
            return Err(Error::new_spanned(
                e,
                format!("a size must be positive, this is {v}"),
            ));
        }
        usize::try_from(v)
            .ok()
            .filter(|&v| v <= MAX_EXTENT)
            .ok_or_else(|| {
                Error::new_spanned(
                    e,
                    format!("a dimension of {v} is over the limit of {MAX_EXTENT} (harl_te::limits::MAX_EXTENT)"),
                )
            })
    }

    /// Size arithmetic, in i128 with checked operations: the values come from the user.
    fn size_i(&self, e: &syn::Expr) -> Result<i128> {
        let _level = self.enter(e.span())?;
        match e {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Int(i),
                ..
            }) => i.base10_parse::<u64>().map(i128::from),
            syn::Expr::Path(p) if p.path.get_ident().is_some() => {
                let id = p.path.get_ident().map(name_of).unwrap_or_default();
                Ok(self.const_named(&id, p.span())? as i128)
            }
            syn::Expr::Paren(p) => self.size_i(&p.expr),
            syn::Expr::Block(b) if b.block.stmts.len() == 1 => match &b.block.stmts[0] {
                syn::Stmt::Expr(e, None) => self.size_i(e),
                s => Err(Error::new_spanned(s, "expected a size")),
            },
            syn::Expr::Binary(bin) => {
                let (a, b) = (self.size_i(&bin.left)?, self.size_i(&bin.right)?);
                let r = match bin.op {
                    syn::BinOp::Add(_) => a.checked_add(b),
                    syn::BinOp::Sub(_) => a.checked_sub(b),
                    syn::BinOp::Mul(_) => a.checked_mul(b),
                    syn::BinOp::Div(_) if b == 0 => {
                        return Err(Error::new_spanned(&bin.right, "division by zero in a size"))
                    }
                    syn::BinOp::Div(_) => a.checked_div(b),
                    _ => {
                        return Err(Error::new_spanned(
                            bin.op,
                            "sizes combine with + - * / only",
                        ))
                    }
                };
                // Intermediate values are bounded far below i128's range, so later products
                // of two of them cannot overflow either.
                r.filter(|v| v.unsigned_abs() <= u64::MAX as u128)
                    .ok_or_else(|| Error::new_spanned(e, "size arithmetic overflows"))
            }
            other => Err(Error::new_spanned(
                other,
                "expected a size: an integer, a size name, or arithmetic of those",
            )),
        }
    }

    fn op_err(span: Span, e: ops::OpError) -> Error {
        Error::new(span, e.to_string())
    }

    fn check_graph(&self, span: Span) -> Result<()> {
        if self.b.graph().stages.is_empty() {
            return Ok(());
        }
        let flagged = self.out_of_bounds.borrow_mut().take();
        match (self.b.graph().validate(), flagged) {
            (Ok(()), _) => Ok(()),
            // Point at the access itself rather than the whole compute.
            (Err(e @ GraphError::OutOfBounds { .. }), Some(tokens)) => {
                Err(Error::new_spanned(tokens, e.to_string()))
            }
            (Err(GraphError::BadConst { value, dtype, .. }), _) => {
                let lits = self.literals.borrow();
                // The literal may have been negated after recording.
                let found = lits.iter().find(|(v, _)| *v == value || -*v == value);
                let what = match found {
                    Some((_, tokens)) => format!("`{tokens}`"),
                    None => format!("the constant {value:e}"),
                };
                let msg = match dtype {
                    DType::I32 => format!(
                        "{what} is not an i32 (an integer in {}..={}) in this i32 expression",
                        i32::MIN,
                        i32::MAX
                    ),
                    d => format!(
                        "{what} is not a finite {} (it overflows the kernel's element type)",
                        d.rust_name()
                    ),
                };
                match found {
                    Some((_, tokens)) => Err(Error::new_spanned(tokens, msg)),
                    None => Err(Error::new(span, msg)),
                }
            }
            (Err(e), _) => Err(Error::new(span, e.to_string())),
        }
    }

    /// Evaluates a tensor expression, adding stages; `name` names a new compute stage.
    fn tensor(&mut self, e: &syn::Expr, name: &str) -> Result<TensorRef> {
        let span = e.span();
        let depth = self.depth.get();
        if depth >= MAX_EXPR_DEPTH {
            return Err(Error::new(
                span,
                format!("expression nested deeper than {MAX_EXPR_DEPTH} levels (harl_te::limits::MAX_EXPR_DEPTH)"),
            ));
        }
        // Not a `Level` guard: that would borrow `self` across the `&mut self` calls below.
        self.depth.set(depth + 1);
        let r = self.tensor_inner(e, name, span);
        self.depth.set(depth);
        r
    }

    fn tensor_inner(&mut self, e: &syn::Expr, name: &str, span: Span) -> Result<TensorRef> {
        let t = match e {
            syn::Expr::Path(p) => {
                let id = p.path.get_ident().map(name_of).unwrap_or_default();
                self.tensors.get(&id).copied().ok_or_else(|| {
                    Error::new(span, format!("unknown tensor `{}`", quote::ToTokens::to_token_stream(&p.path)))
                })?
            }
            syn::Expr::Paren(p) => self.tensor(&p.expr, name)?,
            syn::Expr::Call(_) | syn::Expr::MethodCall(_) => {
                let (call, opts) = split_chain(e)?;
                self.call(call, opts, name)?
            }
            syn::Expr::Binary(bin) => {
                let op = match bin.op {
                    syn::BinOp::Add(_) => BinaryOp::Add,
                    syn::BinOp::Sub(_) => BinaryOp::Sub,
                    syn::BinOp::Mul(_) => BinaryOp::Mul,
                    syn::BinOp::Div(_) => BinaryOp::Div,
                    _ => return Err(Error::new_spanned(bin.op, "tensors combine with + - * /")),
                };
                if let Some(c) = float_lit(&bin.right) {
                    self.record_literal(c, &bin.right);
                    let x = self.tensor(&bin.left, name)?;
                    self.scalar_op(x, op, c, false)
                } else if let Some(c) = float_lit(&bin.left) {
                    self.record_literal(c, &bin.left);
                    let y = self.tensor(&bin.right, name)?;
                    self.scalar_op(y, op, c, true)
                } else {
                    let x = self.tensor(&bin.left, name)?;
                    let y = self.tensor(&bin.right, name)?;
                    ops::broadcast_binary(&mut self.b, op, x, y).map_err(|err| Self::op_err(span, err))?
                }
            }
            syn::Expr::Unary(syn::ExprUnary {
                op: syn::UnOp::Neg(_),
                expr,
                ..
            }) => {
                let x = self.tensor(expr, name)?;
                ops::neg(&mut self.b, x).map_err(|err| Self::op_err(span, err))?
            }
            _ => {
                return Err(Error::new(
                    span,
                    "expected a tensor expression: a name, `compute(..)`, an op call such as `matmul(a, b)`, or `+ - * /` of those",
                ))
            }
        };
        self.check_graph(span)?;
        Ok(t)
    }

    fn record_literal(&self, v: f64, tokens: &impl quote::ToTokens) {
        self.literals
            .borrow_mut()
            .push((v, quote::ToTokens::to_token_stream(tokens)));
    }

    fn scalar_op(&mut self, x: TensorRef, op: BinaryOp, c: f64, lhs_const: bool) -> TensorRef {
        let dtype = self.b.dtype(x);
        let shape = self.b.shape(x);
        let idx: Vec<Expr> = (0..shape.len()).map(Expr::Axis).collect();
        let v = Expr::Load(x, idx);
        let k = Expr::Const(c, dtype);
        let body = if lhs_const {
            k.binary(op, v)
        } else {
            v.binary(op, k)
        };
        self.b.compute("scalar_op", &shape, dtype, body)
    }

    fn arg_tensors(
        &mut self,
        call: &syn::ExprCall,
        n: std::ops::RangeInclusive<usize>,
        name: &str,
    ) -> Result<Vec<TensorRef>> {
        let fname = path_name(&call.func);
        if !n.contains(&call.args.len()) {
            return Err(Error::new_spanned(
                call,
                format!(
                    "`{fname}` takes {} tensor arguments, {} given",
                    fmt_range(&n),
                    call.args.len()
                ),
            ));
        }
        call.args.iter().map(|a| self.tensor(a, name)).collect()
    }

    fn call(&mut self, call: &syn::ExprCall, opts: Options, name: &str) -> Result<TensorRef> {
        let fname = path_name(&call.func);
        let span = call.span();
        let err = |e: ops::OpError| Self::op_err(span, e);
        let known: &[&str] = match fname.as_str() {
            "compute" => {
                no_options(&opts, "compute")?;
                return self.compute(call, name);
            }
            "matmul" | "batch_matmul" => &["transpose_a", "transpose_b"],
            "conv1d" | "conv2d" | "conv3d" | "conv2d_transpose" => &["stride", "pad", "dilation", "groups"],
            "layer_norm" => &["eps"],
            "softmax" => &["axis"],
            "dense" | "relu" | "gelu" | "tanh" | "sigmoid" | "exp" => &[],
            other => {
                return Err(Error::new_spanned(&call.func,
                    format!("unknown op `{other}`; tensor ops are compute, matmul, batch_matmul, dense, conv1d, conv2d, conv3d, conv2d_transpose, softmax, layer_norm, relu, gelu, tanh, sigmoid, exp"),
                ))
            }
        };
        for (o, _, s) in &opts.0 {
            if !known.contains(&o.as_str()) {
                return Err(Error::new(
                    *s,
                    format!(
                        "`{fname}` has no option `{o}`; its options are: {}",
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                ));
            }
        }
        Ok(match fname.as_str() {
            "matmul" | "batch_matmul" => {
                let a = self.arg_tensors(call, 2..=2, name)?;
                let ta = self.flag(&opts, "transpose_a")?;
                let tb = self.flag(&opts, "transpose_b")?;
                if fname == "matmul" {
                    ops::matmul(&mut self.b, a[0], a[1], ta, tb).map_err(err)?
                } else {
                    ops::batch_matmul(&mut self.b, a[0], a[1], ta, tb).map_err(err)?
                }
            }
            "dense" => {
                let a = self.arg_tensors(call, 2..=3, name)?;
                ops::dense(&mut self.b, a[0], a[1], a.get(2).copied(), Activation::None)
                    .map_err(err)?
            }
            "conv1d" => {
                let a = self.arg_tensors(call, 2..=2, name)?;
                let p = Conv1dParams {
                    stride: self.opt_tuple::<1>(&opts, "stride", 1)?[0],
                    pad: self.opt_tuple::<1>(&opts, "pad", 0)?[0],
                    dilation: self.opt_tuple::<1>(&opts, "dilation", 1)?[0],
                    groups: self.opt_tuple::<1>(&opts, "groups", 1)?[0],
                };
                ops::conv1d(&mut self.b, a[0], a[1], p).map_err(err)?
            }
            "conv2d" | "conv2d_transpose" => {
                let a = self.arg_tensors(call, 2..=2, name)?;
                let [sh, sw] = self.opt_tuple::<2>(&opts, "stride", 1)?;
                let [ph, pw] = self.opt_tuple::<2>(&opts, "pad", 0)?;
                let [dh, dw] = self.opt_tuple::<2>(&opts, "dilation", 1)?;
                let p = Conv2dParams {
                    stride: (sh, sw),
                    pad: (ph, pw),
                    dilation: (dh, dw),
                    groups: self.opt_tuple::<1>(&opts, "groups", 1)?[0],
                };
                if fname == "conv2d" {
                    ops::conv2d(&mut self.b, a[0], a[1], p).map_err(err)?
                } else {
                    ops::conv2d_transpose(&mut self.b, a[0], a[1], p).map_err(err)?
                }
            }
            "conv3d" => {
                let a = self.arg_tensors(call, 2..=2, name)?;
                let [sd, sh, sw] = self.opt_tuple::<3>(&opts, "stride", 1)?;
                let [pd, ph, pw] = self.opt_tuple::<3>(&opts, "pad", 0)?;
                let [dd, dh, dw] = self.opt_tuple::<3>(&opts, "dilation", 1)?;
                let p = Conv3dParams {
                    stride: (sd, sh, sw),
                    pad: (pd, ph, pw),
                    dilation: (dd, dh, dw),
                    groups: self.opt_tuple::<1>(&opts, "groups", 1)?[0],
                };
                ops::conv3d(&mut self.b, a[0], a[1], p).map_err(err)?
            }
            "softmax" => {
                let a = self.arg_tensors(call, 1..=1, name)?;
                let rank = self.b.shape(a[0]).len() as isize;
                let axis = match opts.0.iter().find(|o| o.0 == "axis") {
                    Some((_, args, s)) => match args.as_slice() {
                        [e] => signed_int(e)
                            .ok_or_else(|| Error::new(*s, "`axis` takes an integer"))?,
                        _ => return Err(Error::new(*s, "`axis` takes one integer")),
                    },
                    None => rank - 1,
                };
                ops::softmax(&mut self.b, a[0], axis).map_err(err)?
            }
            "layer_norm" => {
                let a = self.arg_tensors(call, 3..=3, name)?;
                let eps = match opts.0.iter().find(|o| o.0 == "eps") {
                    Some((_, args, s)) => match args.as_slice() {
                        [e] => {
                            let v = float_lit(e)
                                .ok_or_else(|| Error::new(*s, "`eps` takes a float literal"))?;
                            self.record_literal(v, e);
                            v
                        }
                        _ => return Err(Error::new(*s, "`eps` takes one float")),
                    },
                    None => 1e-5,
                };
                ops::layer_norm(&mut self.b, a[0], a[1], a[2], eps).map_err(err)?
            }
            f => {
                let a = self.arg_tensors(call, 1..=1, name)?;
                let x = a[0];
                match f {
                    "relu" => ops::relu(&mut self.b, x),
                    "gelu" => ops::gelu(&mut self.b, x),
                    "tanh" => ops::tanh(&mut self.b, x),
                    "sigmoid" => ops::sigmoid(&mut self.b, x),
                    _ => ops::exp(&mut self.b, x),
                }
                .map_err(err)?
            }
        })
    }

    fn flag(&self, opts: &Options, name: &str) -> Result<bool> {
        match opts.0.iter().find(|o| o.0 == name) {
            None => Ok(false),
            Some((_, args, _)) if args.is_empty() => Ok(true),
            Some((_, _, s)) => Err(Error::new(*s, format!("`{name}()` takes no arguments"))),
        }
    }

    /// An option given as one size (applied to every dimension) or a tuple of N sizes.
    fn opt_tuple<const N: usize>(
        &self,
        opts: &Options,
        name: &str,
        default: usize,
    ) -> Result<[usize; N]> {
        let Some((_, args, s)) = opts.0.iter().find(|o| o.0 == name) else {
            return Ok([default; N]);
        };
        let [arg] = args.as_slice() else {
            return Err(Error::new(*s, format!("`{name}` takes one argument")));
        };
        let parse = |e: &syn::Expr| -> Result<usize> {
            let v = self.size_i(e)?;
            usize::try_from(v)
                .map_err(|_| Error::new_spanned(e, format!("`{name}` cannot be negative")))
        };
        match arg {
            syn::Expr::Tuple(t) => {
                if t.elems.len() != N {
                    return Err(Error::new_spanned(
                        t,
                        format!("`{name}` takes {N} values here"),
                    ));
                }
                let mut out = [0; N];
                for (o, e) in out.iter_mut().zip(&t.elems) {
                    *o = parse(e)?;
                }
                Ok(out)
            }
            e => Ok([parse(e)?; N]),
        }
    }

    /// `compute([dims], |axes| body)`.
    fn compute(&mut self, call: &syn::ExprCall, name: &str) -> Result<TensorRef> {
        let usage = "expected `compute([dims], |i, j| expr)`";
        let [dims, closure] = [call.args.first(), call.args.get(1)];
        let (Some(dims), Some(syn::Expr::Closure(closure)), 2) = (dims, closure, call.args.len())
        else {
            return Err(Error::new_spanned(call, usage));
        };
        let shape = self.dims(dims)?;
        if shape.is_empty() {
            return Err(Error::new_spanned(
                dims,
                "a compute needs at least one dimension (0-d tensors are not supported; use `[1]`)",
            ));
        }
        check_shape(dims, &shape, "compute")?;
        self.extents = shape.clone();
        let names = closure_params(closure)?;
        check_unique_axes(&closure.inputs, &names, &[])?;
        if names.len() != shape.len() {
            return Err(Error::new_spanned(
                &closure.inputs,
                format!(
                    "the shape has {} dimensions but the closure names {} axes",
                    shape.len(),
                    names.len()
                ),
            ));
        }
        let mut axes: HashMap<String, usize> = names
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, n)| (n, i))
            .collect();
        // One reduction may wrap the whole body.
        if let Some((op, red_call)) = reduction_call(&closure.body) {
            let (ext_e, red_closure) = match (
                red_call.args.first(),
                red_call.args.get(1),
                red_call.args.len(),
            ) {
                (Some(e), Some(syn::Expr::Closure(c)), 2) => (e, c),
                _ => {
                    return Err(Error::new_spanned(
                        red_call,
                        "expected `sum(K, |k| expr)` or `sum([R, S], |r, s| expr)`",
                    ))
                }
            };
            let extents = self.dims(ext_e)?;
            if extents.is_empty() {
                return Err(Error::new_spanned(
                    ext_e,
                    "a reduction needs at least one reduce axis, e.g. `sum(K, |k| ..)`",
                ));
            }
            if extents.len() > MAX_RANK {
                return Err(Error::new_spanned(
                    ext_e,
                    format!(
                        "{} reduce axes, over the limit of {MAX_RANK} (harl_te::limits::MAX_RANK)",
                        extents.len()
                    ),
                ));
            }
            let domain: Vec<usize> = shape.iter().chain(&extents).copied().collect();
            if checked_product(&domain).is_none_or(|n| n > MAX_DOMAIN) {
                return Err(Error::new_spanned(
                    ext_e,
                    format!("this reduction iterates over {domain:?}, more than {MAX_DOMAIN} points (harl_te::limits::MAX_DOMAIN)"),
                ));
            }
            let rnames = closure_params(red_closure)?;
            if rnames.len() != extents.len() {
                return Err(Error::new_spanned(
                    &red_closure.inputs,
                    "one reduce axis name per extent",
                ));
            }
            check_unique_axes(&red_closure.inputs, &rnames, &names)?;
            for (j, n) in rnames.into_iter().enumerate() {
                axes.insert(n, shape.len() + j);
            }
            self.extents.extend_from_slice(&extents);
            let body = self.scalar(&red_closure.body, &axes)?;
            let dtype = self.dtype_of(&body);
            if !matches!(dtype, DType::F32 | DType::F64 | DType::I32) {
                return Err(Error::new_spanned(
                    &red_closure.body,
                    "a reduction sums numbers, not booleans",
                ));
            }
            return Ok(self.b.reduce(name, &shape, dtype, op, &extents, body));
        }
        let body = self.scalar(&closure.body, &axes)?;
        let dtype = self.dtype_of(&body);
        if dtype == DType::Bool {
            return Err(Error::new_spanned(
                &closure.body,
                "a tensor element cannot be a boolean; use `select(c, 1.0, 0.0)`",
            ));
        }
        Ok(self.b.compute(name, &shape, dtype, body))
    }

    fn dims(&self, e: &syn::Expr) -> Result<Vec<usize>> {
        match e {
            syn::Expr::Array(a) => a.elems.iter().map(|d| self.size(d)).collect(),
            other => Ok(vec![self.size(other)?]),
        }
    }

    fn dtype_of(&self, e: &Expr) -> DType {
        match e {
            Expr::Const(_, d) => *d,
            Expr::Axis(_) => DType::I32,
            Expr::Load(t, _) => self.b.dtype(*t),
            Expr::Unary(_, a) => self.dtype_of(a),
            Expr::Binary(_, a, _) => self.dtype_of(a),
            Expr::Cmp(..) => DType::Bool,
            Expr::Select(_, a, _) => self.dtype_of(a),
            Expr::Cast(d, _) => *d,
        }
    }

    /// Makes a literal operand take the type of the other side (`x * 2` on floats).
    fn unify(&self, a: Expr, b: Expr) -> (Expr, Expr) {
        let (ta, tb) = (self.dtype_of(&a), self.dtype_of(&b));
        match (a, b) {
            (Expr::Const(v, _), b) if ta != tb && tb != DType::Bool => (Expr::Const(v, tb), b),
            (a, Expr::Const(v, _)) if ta != tb && ta != DType::Bool => (a, Expr::Const(v, ta)),
            (a, b) => (a, b),
        }
    }

    fn scalar(&self, e: &syn::Expr, axes: &HashMap<String, usize>) -> Result<Expr> {
        let _level = self.enter(e.span())?;
        let node = quote::ToTokens::to_token_stream(e);
        Ok(match e {
            syn::Expr::Lit(l) => {
                let c = match &l.lit {
                    syn::Lit::Float(f) => Expr::Const(f.base10_parse::<f64>()?, DType::F32),
                    // Parsed as u64 so that `-2147483648` (a negated literal) is reachable;
                    // validation rejects what its final type cannot hold.
                    syn::Lit::Int(i) => Expr::Const(i.base10_parse::<u64>()? as f64, DType::I32),
                    syn::Lit::Bool(b) => Expr::Const(b.value as i64 as f64, DType::Bool),
                    _ => return Err(Error::new_spanned(&node, "expected a number")),
                };
                if let Expr::Const(v, _) = c {
                    self.record_literal(v, &node);
                }
                c
            }
            syn::Expr::Path(p) => {
                let id = p.path.get_ident().map(name_of).unwrap_or_default();
                if let Some(&a) = axes.get(&id) {
                    Expr::Axis(a)
                } else if let Some(&c) = self.consts.get(&id) {
                    // Consts are at most MAX_TENSOR_ELEMS, exact in an f64; one past i32 is
                    // a BadConst pointed at here.
                    self.record_literal(c as f64, &node);
                    Expr::Const(c as f64, DType::I32)
                } else if self.tensors.contains_key(&id) {
                    return Err(Error::new_spanned(
                        &node,
                        format!("`{id}` is a tensor: index it, e.g. `{id}[[i, j]]`"),
                    ));
                } else {
                    return Err(Error::new_spanned(
                        &node,
                        format!(
                            "unknown name `{id}`: not an axis of this compute, a size, or a tensor"
                        ),
                    ));
                }
            }
            syn::Expr::Paren(p) => self.scalar(&p.expr, axes)?,
            syn::Expr::Group(g) => self.scalar(&g.expr, axes)?,
            syn::Expr::Block(b) if b.block.stmts.len() == 1 => match &b.block.stmts[0] {
                syn::Stmt::Expr(e, None) => self.scalar(e, axes)?,
                s => return Err(Error::new_spanned(s, "expected an expression")),
            },
            syn::Expr::Index(ix) => {
                let syn::Expr::Path(p) = &*ix.expr else {
                    return Err(Error::new_spanned(
                        &ix.expr,
                        "index a tensor by name: `t[[i, j]]`",
                    ));
                };
                let id = p.path.get_ident().map(name_of).unwrap_or_default();
                let t = *self
                    .tensors
                    .get(&id)
                    .ok_or_else(|| Error::new_spanned(p, format!("unknown tensor `{id}`")))?;
                let idx: Vec<Expr> = match &*ix.index {
                    syn::Expr::Array(a) => a
                        .elems
                        .iter()
                        .map(|i| self.index(i, axes))
                        .collect::<Result<_>>()?,
                    other => vec![self.index(other, axes)?],
                };
                let rank = self.b.shape(t).len();
                if idx.len() != rank {
                    return Err(Error::new_spanned(
                        &ix.index,
                        format!("`{id}` has {rank} dimensions, indexed with {}", idx.len()),
                    ));
                }
                let shape = self.b.shape(t);
                let leaves = idx.iter().zip(&shape).any(|(i, &n)| {
                    let (lo, hi) = crate::graph::interval(i, &self.extents);
                    lo < 0 || hi >= n as i64
                });
                if leaves && self.out_of_bounds.borrow().is_none() {
                    *self.out_of_bounds.borrow_mut() = Some(quote::ToTokens::to_token_stream(ix));
                }
                Expr::Load(t, idx)
            }
            syn::Expr::Binary(bin) => {
                let a = self.scalar(&bin.left, axes)?;
                let b = self.scalar(&bin.right, axes)?;
                let (a, b) = self.unify(a, b);
                use syn::BinOp as B;
                let arith = |op| Ok::<_, Error>(a.clone().binary(op, b.clone()));
                let cmp = |op| Ok::<_, Error>(a.clone().cmp(op, b.clone()));
                let r = match bin.op {
                    B::Add(_) => arith(BinaryOp::Add),
                    B::Sub(_) => arith(BinaryOp::Sub),
                    B::Mul(_) => arith(BinaryOp::Mul),
                    B::Div(_) => arith(BinaryOp::Div),
                    B::Rem(_) => arith(BinaryOp::Rem),
                    B::And(_) => arith(BinaryOp::And),
                    B::Or(_) => arith(BinaryOp::Or),
                    B::Eq(_) => cmp(CmpOp::Eq),
                    B::Ne(_) => cmp(CmpOp::Ne),
                    B::Lt(_) => cmp(CmpOp::Lt),
                    B::Le(_) => cmp(CmpOp::Le),
                    B::Gt(_) => cmp(CmpOp::Gt),
                    B::Ge(_) => cmp(CmpOp::Ge),
                    _ => {
                        return Err(Error::new_spanned(
                            bin.op,
                            "unsupported operator in a kernel",
                        ))
                    }
                }?;
                self.typecheck(&r, &node)?;
                self.check_int(&r, &node)?;
                r
            }
            syn::Expr::Unary(u) => {
                let x = self.scalar(&u.expr, axes)?;
                match u.op {
                    syn::UnOp::Neg(_) => match x {
                        Expr::Const(v, d) => Expr::Const(-v, d),
                        x => {
                            let r = -x;
                            self.check_int(&r, &node)?;
                            r
                        }
                    },
                    syn::UnOp::Not(_) => x.unary(UnaryOp::Not),
                    _ => return Err(Error::new_spanned(&node, "unsupported unary operator")),
                }
            }
            syn::Expr::Cast(c) => {
                let x = self.scalar(&c.expr, axes)?;
                let d = match &*c.ty {
                    syn::Type::Path(p) => p
                        .path
                        .get_ident()
                        .and_then(|i| DType::from_rust_name(&i.to_string())),
                    _ => None,
                }
                .filter(|d| *d != DType::Bool)
                .ok_or_else(|| Error::new_spanned(&c.ty, "cast to f32, f64 or i32"))?;
                x.cast(d)
            }
            syn::Expr::If(i) => {
                let c = self.scalar(&i.cond, axes)?;
                let a = self.block_expr(&i.then_branch, axes)?;
                let Some((_, else_e)) = &i.else_branch else {
                    return Err(Error::new_spanned(
                        &node,
                        "`if` in a kernel needs an `else`",
                    ));
                };
                let b = self.scalar(else_e, axes)?;
                let (a, b) = self.unify(a, b);
                let r = Expr::select(c, a, b);
                self.typecheck(&r, &node)?;
                r
            }
            syn::Expr::Call(call) => {
                let f = path_name(&call.func);
                let args: Vec<Expr> = call
                    .args
                    .iter()
                    .map(|a| self.scalar(a, axes))
                    .collect::<Result<_>>()?;
                self.function(&f, args, &node, call.func.span())?
            }
            syn::Expr::MethodCall(m) => {
                let mut args = vec![self.scalar(&m.receiver, axes)?];
                for a in &m.args {
                    args.push(self.scalar(a, axes)?);
                }
                self.function(&name_of(&m.method), args, &node, m.method.span())?
            }
            _ => {
                return Err(Error::new_spanned(
                    &node,
                    "unsupported expression in a kernel body",
                ))
            }
        })
    }

    /// Integer arithmetic of axes and constants must stay inside i32 (the interpreter wraps at
    /// 32 bits, the emitted index code does not) and must not divide by a possible zero.
    fn check_int(&self, e: &Expr, node: &TokenStream) -> Result<()> {
        if self.dtype_of(e) != DType::I32 {
            return Ok(());
        }
        if let Expr::Binary(BinaryOp::Div | BinaryOp::Rem, _, b) = e {
            let zero = match exact_interval(b, &self.extents) {
                Some((lo, hi)) => lo <= 0 && hi >= 0,
                None => matches!(**b, Expr::Const(v, _) if v == 0.0),
            };
            if zero {
                return Err(Error::new_spanned(
                    node,
                    "integer division by a divisor that can be zero",
                ));
            }
        }
        match exact_interval(e, &self.extents) {
            Some((lo, hi)) if lo < i32::MIN as i128 || hi > i32::MAX as i128 => {
                Err(Error::new_spanned(
                    node,
                    format!("integer arithmetic reaches {lo}..={hi}, outside i32"),
                ))
            }
            _ => Ok(()),
        }
    }

    fn block_expr(&self, b: &syn::Block, axes: &HashMap<String, usize>) -> Result<Expr> {
        match b.stmts.as_slice() {
            [syn::Stmt::Expr(e, None)] => self.scalar(e, axes),
            _ => Err(Error::new_spanned(b, "expected one expression")),
        }
    }

    fn index(&self, e: &syn::Expr, axes: &HashMap<String, usize>) -> Result<Expr> {
        let x = self.scalar(e, axes)?;
        if self.dtype_of(&x) != DType::I32 {
            return Err(Error::new_spanned(
                e,
                "an index must be an integer expression of axes and sizes",
            ));
        }
        Ok(x)
    }

    /// Rejects ill-typed operations here, where there is a span, rather than at graph validation.
    fn typecheck(&self, e: &Expr, node: &TokenStream) -> Result<()> {
        let (a, b) = match e {
            Expr::Binary(_, a, b) | Expr::Cmp(_, a, b) | Expr::Select(_, a, b) => (a, b),
            _ => return Ok(()),
        };
        let (ta, tb) = (self.dtype_of(a), self.dtype_of(b));
        if ta != tb {
            return Err(Error::new_spanned(
                node,
                format!(
                    "mismatched types {} and {}: convert with `as`",
                    ta.rust_name(),
                    tb.rust_name()
                ),
            ));
        }
        if let Expr::Select(c, ..) = e {
            if self.dtype_of(c) != DType::Bool {
                return Err(Error::new_spanned(
                    node,
                    "the condition must be a comparison",
                ));
            }
        }
        Ok(())
    }

    fn function(&self, f: &str, args: Vec<Expr>, node: &TokenStream, fspan: Span) -> Result<Expr> {
        let arity = |n: usize| -> Result<()> {
            if args.len() == n {
                Ok(())
            } else {
                Err(Error::new_spanned(
                    node,
                    format!("`{f}` takes {n} arguments, {} given", args.len()),
                ))
            }
        };
        let float = |e: &Expr| -> Result<()> {
            if self.dtype_of(e).is_float() {
                Ok(())
            } else {
                Err(Error::new_spanned(
                    node,
                    format!("`{f}` needs a float argument (use `as f32`)"),
                ))
            }
        };
        let mut it = args.clone().into_iter();
        let mut next = || it.next().unwrap_or(Expr::int(0));
        let r = match f {
            "max" | "min" => {
                arity(2)?;
                let (a, b) = self.unify(next(), next());
                let r = if f == "max" { a.max(b) } else { a.min(b) };
                self.typecheck(&r, node)?;
                r
            }
            "exp" | "log" | "ln" | "sqrt" | "tanh" | "erf" => {
                arity(1)?;
                let a = next();
                float(&a)?;
                a.unary(match f {
                    "exp" => UnaryOp::Exp,
                    "log" | "ln" => UnaryOp::Log,
                    "sqrt" => UnaryOp::Sqrt,
                    "tanh" => UnaryOp::Tanh,
                    _ => UnaryOp::Erf,
                })
            }
            "abs" => {
                arity(1)?;
                next().unary(UnaryOp::Abs)
            }
            "select" => {
                arity(3)?;
                let c = next();
                let (a, b) = self.unify(next(), next());
                let r = Expr::select(c, a, b);
                self.typecheck(&r, node)?;
                r
            }
            "sum" | "reduce_max" | "reduce_min" => {
                return Err(Error::new(fspan, format!("`{f}` must be the whole body of a `compute` closure")))
            }
            _ => {
                return Err(Error::new(
                    fspan,
                    format!("unknown function `{f}`; kernels know max, min, exp, log, sqrt, tanh, erf, abs, select"),
                ))
            }
        };
        Ok(r)
    }
}

/// Splits `op(args).opt1(x).opt2()` into the call and its options.
fn split_chain(e: &syn::Expr) -> Result<(&syn::ExprCall, Options)> {
    let mut opts = Vec::new();
    let mut cur = e;
    loop {
        match cur {
            syn::Expr::MethodCall(m) => {
                opts.push((
                    name_of(&m.method),
                    m.args.iter().cloned().collect(),
                    m.method.span(),
                ));
                cur = &m.receiver;
            }
            syn::Expr::Call(c) => {
                opts.reverse();
                return Ok((c, Options(opts)));
            }
            other => {
                return Err(Error::new_spanned(
                    other,
                    "options follow an op call, e.g. `conv2d(x, w).stride(2)`",
                ))
            }
        }
    }
}

fn no_options(opts: &Options, f: &str) -> Result<()> {
    match opts.0.first() {
        Some((o, _, s)) => Err(Error::new(*s, format!("`{f}` has no option `{o}`"))),
        None => Ok(()),
    }
}

fn reduction_call(body: &syn::Expr) -> Option<(ReduceOp, &syn::ExprCall)> {
    let syn::Expr::Call(c) = body else {
        return None;
    };
    let op = match path_name(&c.func).as_str() {
        "sum" => ReduceOp::Sum,
        "reduce_max" => ReduceOp::Max,
        "reduce_min" => ReduceOp::Min,
        _ => return None,
    };
    Some((op, c))
}

fn closure_params(c: &syn::ExprClosure) -> Result<Vec<String>> {
    c.inputs
        .iter()
        .map(|p| match p {
            syn::Pat::Ident(i) => Ok(name_of(&i.ident)),
            syn::Pat::Type(t) => match &*t.pat {
                syn::Pat::Ident(i) => Ok(name_of(&i.ident)),
                other => Err(Error::new_spanned(
                    other,
                    "axis names are plain identifiers",
                )),
            },
            other => Err(Error::new_spanned(
                other,
                "axis names are plain identifiers",
            )),
        })
        .collect()
}

fn path_name(e: &syn::Expr) -> String {
    match e {
        syn::Expr::Path(p) => p
            .path
            .segments
            .last()
            .map(|s| name_of(&s.ident))
            .unwrap_or_default(),
        _ => String::new(),
    }
}

/// An identifier's name without `r#`: `r#type` and `type` are one name to the DSL.
fn name_of(i: &syn::Ident) -> String {
    i.unraw().to_string()
}

/// Rank, extents and element count of a declared or computed shape, with a span.
fn check_shape(at: &impl quote::ToTokens, shape: &[usize], what: &str) -> Result<()> {
    if shape.len() > MAX_RANK {
        return Err(Error::new_spanned(
            at,
            format!("a {what} of {} dimensions, over the limit of {MAX_RANK} (harl_te::limits::MAX_RANK)", shape.len()),
        ));
    }
    if let Some(n) = shape.iter().find(|&&n| n > MAX_EXTENT) {
        return Err(Error::new_spanned(
            at,
            format!("a dimension of {n} is over the limit of {MAX_EXTENT} (harl_te::limits::MAX_EXTENT)"),
        ));
    }
    if checked_product(shape).is_none_or(|n| n > MAX_TENSOR_ELEMS) {
        return Err(Error::new_spanned(
            at,
            format!("a {what} of shape {shape:?} has more than {MAX_TENSOR_ELEMS} elements (harl_te::limits::MAX_TENSOR_ELEMS)"),
        ));
    }
    Ok(())
}

/// Axis names of one closure are distinct, and distinct from `outer` (the spatial axes, for a
/// reduction's closure).
fn check_unique_axes(
    inputs: &Punctuated<syn::Pat, syn::Token![,]>,
    names: &[String],
    outer: &[String],
) -> Result<()> {
    for (i, (n, pat)) in names.iter().zip(inputs).enumerate() {
        if names[..i].contains(n) || outer.contains(n) {
            return Err(Error::new_spanned(
                pat,
                format!("axis `{n}` is named twice"),
            ));
        }
    }
    Ok(())
}

fn float_lit(e: &syn::Expr) -> Option<f64> {
    match e {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Float(f),
            ..
        }) => f.base10_parse().ok(),
        syn::Expr::Unary(syn::ExprUnary {
            op: syn::UnOp::Neg(_),
            expr,
            ..
        }) => float_lit(expr).map(|v| -v),
        _ => None,
    }
}

fn signed_int(e: &syn::Expr) -> Option<isize> {
    match e {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(i),
            ..
        }) => i.base10_parse().ok(),
        syn::Expr::Unary(syn::ExprUnary {
            op: syn::UnOp::Neg(_),
            expr,
            ..
        }) => signed_int(expr).map(|v| -v),
        _ => None,
    }
}

fn fmt_range(r: &std::ops::RangeInclusive<usize>) -> String {
    if r.start() == r.end() {
        r.start().to_string()
    } else {
        format!("{} to {}", r.start(), r.end())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As the macro does: token limits first, then syn, then the DSL.
    fn parse(attr: &str, item: &str) -> Result<KernelDecl> {
        let attr: TokenStream = attr.parse().expect("tokens");
        let tokens: TokenStream = item.parse().expect("tokens");
        check_token_limits(&attr)?;
        check_token_limits(&tokens)?;
        let item: syn::ItemFn = syn::parse2(tokens)?;
        parse_kernel(attr, &item)
    }

    #[test]
    fn compute_dsl_builds_matmul_relu() {
        let k = parse(
            "M = 4, K = 3, N = 5",
            "fn f(a: Tensor<f32, M, K>, w: Tensor<f32, K, N>, bias: Tensor<f32, N>) -> Tensor<f32, M, N> {
                let mm = compute([M, N], |i, j| sum(K, |k| a[[i, k]] * w[[k, j]]));
                compute([M, N], |i, j| max(mm[[i, j]] + bias[j], 0.0))
            }",
        )
        .expect("parses");
        assert_eq!(k.graph.stages.len(), 2);
        assert_eq!(k.out_shape, vec![4, 5]);
        assert_eq!(k.params.len(), 3);
    }

    #[test]
    fn op_calls_and_compute_have_the_same_key() {
        let a = parse(
            "",
            "fn f(a: Tensor<f32, 4, 3>, w: Tensor<f32, 3, 5>) -> Tensor<f32, 4, 5> { matmul(a, w) }",
        )
        .expect("parses");
        let b = parse(
            "",
            "fn g(x: Tensor<f32, 4, 3>, y: Tensor<f32, 3, 5>) -> Tensor<f32, 4, 5> { matmul(x, y) }",
        )
        .expect("parses");
        assert_eq!(a.graph.workload_key(), b.graph.workload_key());
    }

    #[test]
    fn conv_options_parse() {
        let k = parse(
            "",
            "fn c(x: Tensor<f32, 1, 3, 8, 8>, w: Tensor<f32, 4, 3, 3, 3>) -> Tensor<f32, 1, 4, 4, 4> {
                relu(conv2d(x, w).stride(2).pad(1))
            }",
        )
        .expect("parses");
        assert_eq!(k.out_shape, vec![1, 4, 4, 4]);
    }

    #[test]
    fn errors_name_the_problem() {
        let cases = [
            (
                "",
                "fn f(a: Tensor<f32, N>) -> Tensor<f32, 4> { relu(a) }",
                "unknown size `N`",
            ),
            (
                "",
                "fn f(a: Tensor<f32, 4>) -> Tensor<f32, 5> { relu(a) }",
                "signature returns",
            ),
            (
                "",
                "fn f(a: Tensor<f32, 4>) -> Tensor<f32, 4> { compute([4], |i| a[[i + 1]]) }",
                "outside",
            ),
            (
                "",
                "fn f(a: Tensor<f32, 4>) -> Tensor<f32, 4> { frobnicate(a) }",
                "unknown op",
            ),
            (
                "",
                "fn f(a: Tensor<u8, 4>) -> Tensor<f32, 4> { relu(a) }",
                "element type",
            ),
            (
                "",
                "fn f(a: Tensor<f32, 4>) -> Tensor<f32, 4> { compute([4], |i| a[[i]] + b[[i]]) }",
                "unknown tensor `b`",
            ),
            (
                "",
                "fn f(a: Tensor<f32, 4>) -> Tensor<f32, 4> { conv2d(a, a).strides(2) }",
                "no option `strides`",
            ),
        ];
        for (attr, item, want) in cases {
            let err = parse(attr, item).expect_err(item).to_string();
            assert!(err.contains(want), "{item}: got `{err}`, want `{want}`");
        }
    }

    /// Runs `f` on an 8 MiB stack, as rustc gives the thread that runs proc macros (test
    /// threads get 2 MiB, and a debug build's syn and DSL frames are large).
    fn on_rustc_stack(f: impl FnOnce() + Send + 'static) {
        std::thread::Builder::new()
            .stack_size(8 << 20)
            .spawn(f)
            .expect("thread")
            .join()
            .expect("no panic");
    }

    #[test]
    fn hostile_inputs_are_errors_with_a_message() {
        on_rustc_stack(hostile_inputs);
    }

    fn hostile_inputs() {
        let kernel = |body: String| {
            format!("fn f(a: Tensor<f32, 4>) -> Tensor<f32, 4> {{ compute([4], |i| {body}) }}")
        };
        let deep_item = kernel(format!(
            "{}a[[i]]{}",
            "(".repeat(10_000),
            ")".repeat(10_000)
        ));
        let chain_item = kernel(vec!["a[[i]]"; 400].join(" + "));
        let long_item = kernel(vec!["a[[i]]"; 100_000].join(" + "));
        let neg_item = kernel(format!("{}a[[i]]", "-".repeat(10_000)));
        let ok_deep = kernel(format!("{}a[[i]]{}", "(".repeat(250), ")".repeat(250)));
        let size_chain = format!(
            "fn f(a: Tensor<f32, {{ {} }}>) -> Tensor<f32, 4> {{ relu(a) }}",
            vec!["1"; 1000].join(" + ")
        );
        let cases: Vec<(&str, &str, &str)> = vec![
            ("N = 4294967296", "fn f(a: Tensor<f32, N, N>) -> Tensor<f32, N, N> { relu(a) }", "over the limit"),
            ("N = 65536", "fn f(a: Tensor<f32, N, N, N>) -> Tensor<f32, N, N, N> { relu(a) }", "more than 17179869184 elements"),
            ("N = 17179869184", "fn f(a: Tensor<f32, { N * N * N * N }>) -> Tensor<f32, 4> { relu(a) }", "overflows"),
            ("N = 99999999999999999999", "fn f(a: Tensor<f32, N>) -> Tensor<f32, 4> { relu(a) }", "too large"),
            ("N = 18446744073709551615", "fn f(a: Tensor<f32, N>) -> Tensor<f32, 4> { relu(a) }", "at most"),
            ("", "fn f(a: Tensor<f32, 18446744073709551615>) -> Tensor<f32, 4> { relu(a) }", "over the limit"),
            ("N = 8", "fn f(a: Tensor<f32, { N / (N - N) }>) -> Tensor<f32, 8> { relu(a) }", "division by zero"),
            ("N = 0", "fn f(a: Tensor<f32, N>) -> Tensor<f32, 4> { relu(a) }", "at least 1"),
            ("N = 4", "fn f(a: Tensor<f32, { N - 4 }>) -> Tensor<f32, 4> { relu(a) }", "positive"),
            ("", "fn f(a: Tensor<f32>) -> Tensor<f32, 1> { relu(a) }", "at least one dimension"),
            ("", "fn f(a: Tensor<f32, 4>) -> Tensor<f32, 4> { let s = compute([], || a[[0]]); relu(a) }", "at least one dimension"),
            ("N = 4", "fn f(a: Tensor<f32, N>) -> Tensor<f32, N> { compute([N], |i| sum([], || a[[i]])) }", "at least one reduce axis"),
            ("N = 4", "fn f(a: Tensor<f32, N>) -> Tensor<f32, N> { compute([N], |i| reduce_max([], || a[[i]])) }", "at least one reduce axis"),
            ("N = 65536", "fn f(a: Tensor<f32, N>) -> Tensor<f32, N> { compute([N], |i| sum([N, N, N], |x, y, z| a[[i]])) }", "more than 70368744177664 points"),
            ("", "fn f(a: Tensor<f32, 4>) -> Tensor<f32, 4> { a * 1e39 }", "not a finite f32"),
            ("", "fn f(a: Tensor<f32, 4>) -> Tensor<f32, 4> { 1e39 * a }", "not a finite f32"),
            ("", "fn f(a: Tensor<f32, 4>) -> Tensor<f32, 4> { compute([4], |i| a[[i]] + -3.5e38) }", "not a finite f32"),
            ("", "fn f(a: Tensor<f32, 4>) -> Tensor<f32, 4> { compute([4], |i| 1e39) }", "not a finite f32"),
            ("", "fn f(a: Tensor<f64, 4>) -> Tensor<f64, 4> { compute([4], |i| a[[i]] * 1e309) }", "not a finite f64"),
            ("", "fn f(a: Tensor<i32, 4>) -> Tensor<i32, 4> { compute([4], |i| a[[i]] + 3000000000) }", "not an i32"),
            ("", "fn f(a: Tensor<i32, 4>) -> Tensor<i32, 4> { compute([4], |i| a[[i]] * 2.5) }", "not an i32"),
            ("", "fn f(a: Tensor<i32, 4>) -> Tensor<i32, 4> { compute([4], |i| a[[i]] + 99999999999999999999) }", "too large"),
            ("", "fn f(a: Tensor<f32, 4>, a: Tensor<f32, 4>) -> Tensor<f32, 4> { a + a }", "declared twice"),
            ("", "fn f(a: Tensor<f32, 4>, r#a: Tensor<f32, 4>) -> Tensor<f32, 4> { a + a }", "declared twice"),
            ("", "fn f(a: Tensor<f32, 4>) -> Tensor<f32, 4> { let a = relu(a); a }", "already bound"),
            ("", "fn f(a: Tensor<f32, 4>) -> Tensor<f32, 4> { let b = relu(a); let b = exp(b); b }", "already bound"),
            ("", "fn f(a: Tensor<f32, 4, 4>) -> Tensor<f32, 4, 4> { compute([4, 4], |i, i| a[[i, i]]) }", "named twice"),
            ("", "fn f(a: Tensor<f32, 4, 4>) -> Tensor<f32, 4> { compute([4], |i| sum(4, |i| a[[i, i]])) }", "named twice"),
            ("", "fn f(a: Tensor<f32, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1>) -> Tensor<f32, 1> { relu(a) }", "over the limit of 16"),
            ("N = 65536", "fn f(a: Tensor<f32, N>) -> Tensor<f32, N> { compute([N], |i| select(i * i * 2 < 0, a[[i]], 0.0)) }", "outside i32"),
            ("", "fn f(a: Tensor<f32, 4>) -> Tensor<f32, 4> { compute([4], |i| a[[i + 2147483647 - 2147483647]]) }", "outside i32"),
            ("N = 3000000000", "fn f(a: Tensor<f32, 4>) -> Tensor<f32, 4> { compute([4], |i| a[[i]] + (N as f32)) }", "not an i32"),
            ("", "fn f(a: Tensor<i32, 4>) -> Tensor<i32, 4> { compute([4], |i| a[[i]] / i) }", "divisor that can be zero"),
            ("", "fn f(a: Tensor<i32, 4>) -> Tensor<i32, 4> { compute([4], |i| a[[i]] % 0) }", "divisor that can be zero"),
            ("", &deep_item, "brackets nested deeper than 64"),
            ("", &chain_item, "nested deeper than 256"),
            ("", &long_item, "more than 4096 tokens"),
            ("", &neg_item, "operators in a row"),
            ("", &ok_deep, "brackets nested deeper than 64"),
            ("", &size_chain, "nested deeper than 256"),
        ];
        for (attr, item, want) in cases {
            let err = match parse(attr, item) {
                Ok(_) => panic!("{item}: parsed, want an error `{want}`"),
                Err(e) => e.to_string(),
            };
            assert!(err.contains(want), "{item}: got `{err}`, want `{want}`");
        }
    }

    #[test]
    fn raw_identifiers_are_plain_names() {
        let k = parse(
            "r#N = 4",
            "fn r#match(r#type: Tensor<f32, N>, b: Tensor<f32, r#N>) -> Tensor<f32, 4> {
                let r#let = compute([N], |r#i| r#type[[r#i]] + b[[i]]);
                r#let
            }",
        )
        .expect("parses");
        assert_eq!(k.name, "match");
        assert_eq!(k.params[0].name, "type");
        assert_eq!(k.output_name(), "out");
    }

    #[test]
    fn a_param_named_out_moves_the_output_name() {
        let k = parse(
            "",
            "fn f(out: Tensor<f32, 4>, out_: Tensor<f32, 4>) -> Tensor<f32, 4> { out + out_ }",
        )
        .expect("parses");
        assert_eq!(k.output_name(), "out__");
    }

    #[test]
    fn limits_admit_big_real_shapes() {
        // A 32768^3 GEMM (2^45 iterations) and an i32 literal at its bounds stay valid.
        parse(
            "M = 32768, K = 32768, N = 32768",
            "fn f(a: Tensor<f32, M, K>, w: Tensor<f32, K, N>) -> Tensor<f32, M, N> { matmul(a, w) }",
        )
        .expect("parses");
        parse(
            "",
            "fn f(a: Tensor<i32, 4>) -> Tensor<i32, 4> { compute([4], |i| a[[i]] + -2147483648 + 2147483647) }",
        )
        .expect("parses");
        parse(
            "",
            "fn f(a: Tensor<f32, 4>) -> Tensor<f32, 4> { compute([4], |i| a[[i]] * 3.4e38) }",
        )
        .expect("parses");
    }
}
