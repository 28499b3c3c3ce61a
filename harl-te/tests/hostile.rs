//! Random small graphs and kernels, some hostile: validation and the DSL either accept them or
//! return a typed error, and never panic.

use harl_te::{load, DType, Expr, GraphBuilder, ReduceOp};
use proptest::prelude::*;

/// Extents from tiny to past every limit, so products wrap if anything is unchecked.
fn extent() -> impl Strategy<Value = usize> {
    prop_oneof![
        1usize..8,
        Just(0usize),
        Just(1usize << 31),
        Just(1usize << 32),
        Just(usize::MAX),
        (0u32..64).prop_map(|s| 1usize << s),
    ]
}

fn index_expr(rank: usize) -> impl Strategy<Value = Expr> {
    let leaf = prop_oneof![
        (0..rank.max(1) + 1).prop_map(Expr::Axis),
        (-3i64..3).prop_map(Expr::int),
        Just(Expr::int(i32::MAX as i64)),
        Just(Expr::int(i32::MIN as i64)),
        Just(Expr::Const(1e12, DType::I32)),
    ];
    leaf.prop_recursive(4, 16, 2, |inner| {
        (inner.clone(), inner, 0..5usize).prop_map(|(a, b, op)| match op {
            0 => a + b,
            1 => a - b,
            2 => a * b,
            3 => a / b,
            _ => a % b,
        })
    })
}

proptest! {
    #[test]
    fn validate_never_panics(
        shape in prop::collection::vec(extent(), 0..5),
        reduce in prop::option::of(prop::collection::vec(extent(), 0..4)),
        idx in prop::collection::vec(index_expr(4), 0..5),
        c in prop_oneof![Just(1.0), Just(1e39), Just(f64::NAN), Just(-3.5e38), any::<f64>()],
    ) {
        let mut b = GraphBuilder::new();
        let a = b.input("a", &shape, DType::F32);
        let body = load(a, idx) * Expr::f32(1.0) + Expr::lit(c, DType::F32);
        match reduce {
            Some(r) => b.reduce("s", &shape, DType::F32, ReduceOp::Sum, &r, body),
            None => b.compute("s", &shape, DType::F32, body),
        };
        // Ok or a typed error; a panic (an overflow in debug) fails the test.
        let _ = b.graph().validate();
    }
}

#[cfg(feature = "dsl")]
mod dsl {
    use super::*;

    fn dim() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u64..6).prop_map(|v| v.to_string()),
            Just("N".to_string()),
            Just("{ N * N }".to_string()),
            Just("{ N - N }".to_string()),
            Just("{ N / (N - N) }".to_string()),
            Just("18446744073709551615".to_string()),
        ]
    }

    fn body() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("relu(a)".to_string()),
            Just("a * 1e39".to_string()),
            Just("compute([N], |i| sum([], || a[[i]]))".to_string()),
            Just("compute([N], |i, i| a[[i]])".to_string()),
            Just("compute([N], |i| a[[i * i * i]])".to_string()),
            Just("compute([N], |i| a[[i / (i - i)]])".to_string()),
            Just("compute([], || a[[0]])".to_string()),
            Just("let a = relu(a); a".to_string()),
            Just("compute([N], |r#i| a[[r#i]] + 2147483648)".to_string()),
            (1usize..400).prop_map(|n| format!("{}a{}", "(".repeat(n), ")".repeat(n))),
            (1usize..120).prop_map(|n| vec!["a"; n].join(" + ")),
        ]
    }

    proptest! {
        #[test]
        fn parse_never_panics(
            n in prop_oneof![Just(0u64), Just(4), Just(1 << 32), Just(u64::MAX)],
            dims in prop::collection::vec(dim(), 0..4),
            body in body(),
        ) {
            let dims = dims.iter().map(|d| format!(", {d}")).collect::<String>();
            let item = format!("fn f(a: Tensor<f32{dims}>) -> Tensor<f32{dims}> {{ {body} }}");
            let attr: proc_macro2::TokenStream = format!("N = {n}").parse().expect("tokens");
            let Ok(tokens) = item.parse::<proc_macro2::TokenStream>() else { return Ok(()) };
            // As the macro does: token limits, then syn, then the DSL.
            if harl_te::dsl::check_token_limits(&tokens).is_err() {
                return Ok(());
            }
            let Ok(item) = syn::parse2::<syn::ItemFn>(tokens) else { return Ok(()) };
            if let Ok(k) = harl_te::dsl::parse_kernel(attr, &item) {
                prop_assert!(k.graph.validate().is_ok());
            }
        }
    }
}
