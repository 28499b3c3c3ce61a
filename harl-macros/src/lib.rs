//! `#[harl::kernel]`: checks a kernel declaration and wires in the code `build.rs` generated.
//!
//! The macro parses the item with the same DSL parser the build script uses
//! (`harl_te::dsl`), so a mistake is reported here, with a span, as a `compile_error!`. On
//! success it expands to a module holding the generated kernel (from `$OUT_DIR/harl/`) and a
//! typed, safe function that checks slice lengths and runs it.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote};

/// Declares a tensor kernel; see the `harl` crate docs and README for the DSL.
///
/// ```text
/// #[harl::kernel(M = 64, K = 128, N = 256)]
/// pub fn dense_relu(a: Tensor<f32, M, K>, w: Tensor<f32, K, N>, bias: Tensor<f32, N>) -> Tensor<f32, M, N> {
///     relu(matmul(a, w) + bias)
/// }
/// // expands to
/// // pub fn dense_relu(a: &[f32], w: &[f32], bias: &[f32], out: &mut [f32]) -> Result<(), harl::KernelError>
/// // pub mod dense_relu { pub fn schedule_source() -> &str; pub const WORKLOAD_KEY: &str; ... }
/// ```
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    // Before syn sees the tokens: its parser recurses per group and per unary operator, and a
    // stack overflow here would abort rustc instead of reporting an error.
    let (attr2, item2): (TokenStream2, TokenStream2) = (attr.clone().into(), item.clone().into());
    if let Err(e) = harl_te::dsl::check_token_limits(&attr2)
        .and_then(|()| harl_te::dsl::check_token_limits(&item2))
    {
        return e.to_compile_error().into();
    }
    let item_fn = match syn::parse::<syn::ItemFn>(item) {
        Ok(f) => f,
        Err(e) => {
            return syn::Error::new(e.span(), "#[harl::kernel] goes on a function: `fn name(x: Tensor<f32, N>) -> Tensor<f32, N> { ... }`")
                .to_compile_error()
                .into()
        }
    };
    match expand(attr.into(), &item_fn) {
        Ok(ts) => ts.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

const SETUP: &str = "add:\n  Cargo.toml:  [build-dependencies] harl-build = \"0.1\"\n  build.rs:    fn main() { harl_build::Builder::new().scan_crate().compile(); }";

fn expand(attr: TokenStream2, f: &syn::ItemFn) -> syn::Result<TokenStream2> {
    let decl = harl_te::dsl::parse_kernel(attr, f)?;
    let key = decl.graph.workload_key();
    let file = decl.generated_file();
    let name_span = f.sig.ident.span();
    // OUT_DIR can leak in from an outer cargo (a test that runs cargo); only this package's
    // own build-script directory (`.../build/<package>-<hash>/out`) counts.
    let own_out_dir = std::env::var_os("OUT_DIR").filter(|dir| {
        let pkg = std::env::var("CARGO_PKG_NAME").unwrap_or_default();
        std::path::Path::new(dir)
            .parent()
            .and_then(|p| p.file_name())
            .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{pkg}-")))
    });
    let Some(out_dir) = own_out_dir else {
        return Err(syn::Error::new(
            name_span,
            format!("`#[harl::kernel]` needs a build script that runs harl-build, and this crate has none; {SETUP}"),
        ));
    };
    let path = std::path::Path::new(&out_dir).join("harl").join(&file);
    if !path.exists() {
        return Err(syn::Error::new(
            name_span,
            format!(
                "harl: build.rs did not generate kernel `{}` (expected OUT_DIR/harl/{file}); does build.rs scan this file? {SETUP}",
                decl.name
            ),
        ));
    }
    let vis = &f.vis;
    let name = &f.sig.ident;
    let docs: Vec<&syn::Attribute> = f
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .collect();
    let other_attrs: Vec<&syn::Attribute> = f
        .attrs
        .iter()
        .filter(|a| !a.path().is_ident("doc") && !harl_te::dsl::is_kernel_attr(a))
        .collect();
    // The signature's own identifiers, so `r#type` stays raw; the DSL's names are unraw'd and
    // may be keywords, so they are never turned back into identifiers here.
    let idents: Vec<syn::Ident> = f
        .sig
        .inputs
        .iter()
        .filter_map(|a| match a {
            syn::FnArg::Typed(pt) => match &*pt.pat {
                syn::Pat::Ident(id) => Some(id.ident.clone()),
                _ => None,
            },
            syn::FnArg::Receiver(_) => None,
        })
        .collect();
    if idents.len() != decl.params.len() {
        // parse_kernel accepts only plain-name parameters, so this is a bug, not user error.
        return Err(syn::Error::new_spanned(
            &f.sig.inputs,
            "harl: internal error: parameter list does not match the parsed kernel",
        ));
    }
    let params = idents.iter().zip(&decl.params).map(|(id, p)| {
        let ty = format_ident!("{}", p.dtype.rust_name());
        quote!(#id: &[#ty])
    });
    let args = idents.iter();
    let out_id = syn::Ident::new(&decl.output_name(), Span::call_site());
    let out_ty = format_ident!("{}", decl.out_dtype.rust_name());
    let shapes: String = decl
        .params
        .iter()
        .map(|p| format!("`{}`: {} {:?}; ", p.name, p.dtype.rust_name(), p.shape))
        .collect();
    let shape_doc = format!(
        " Shapes (row-major): {shapes}output `{}`: {} {:?}. Errors if a slice length does not match.",
        decl.output_name(),
        decl.out_dtype.rust_name(),
        decl.out_shape
    );
    let mod_doc = format!(
        " Generated code of kernel `{}` (workload key `{key}`).",
        decl.name
    );
    let include_path = format!("/harl/{file}");
    Ok(quote! {
        #[doc = #mod_doc]
        #[allow(warnings, clippy::all, unsafe_code, missing_docs)]
        #vis mod #name {
            include!(concat!(env!("OUT_DIR"), #include_path));
        }
        #(#docs)*
        #[doc = ""]
        #[doc = #shape_doc]
        #(#other_attrs)*
        #vis fn #name(#(#params,)* #out_id: &mut [#out_ty]) -> ::core::result::Result<(), ::harl::KernelError> {
            #name::run(#(#args,)* #out_id)
        }
    })
}
