//! The one attribute that registers a plugin: `#[register]` on a `static` whose type is one
//! of the registry's entry types (`PatternEntry`, `MaskEntry`, `LambdaEntry`, `MixerEntry`,
//! `BackendEntry`, `FamilyEntry`, `LambdaGradEntry`). It places the static in the matching link-time slice, and
//! an `Origin` (the registering module) in the `ORIGINS` slice, so plugin crates never name
//! `linkme` themselves and duplicate names can be reported by crate.

use proc_macro::TokenStream;
use proc_macro_crate::{FoundCrate, crate_name};
use quote::quote;
use syn::{ItemStatic, Path, Type, parse_macro_input};

/// Registers the annotated `static` in the registry slice of its entry type.
///
/// ```ignore
/// #[mixer_registry::register]
/// static FIB: PatternEntry = PatternEntry { name: "fibonacci", doc: "…", offset: fib };
/// ```
/// The registry is found as `mixer_registry` or, failing that, `mixers::registry`; pass
/// `#[register(crate = path::to::registry)]` to name it explicitly.
#[proc_macro_attribute]
pub fn register(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item = parse_macro_input!(item as ItemStatic);
    let explicit: Option<Path> = if attr.is_empty() {
        None
    } else {
        let mut found = None;
        let attr2 = attr.clone();
        let p = syn::meta::parser(|meta| {
            if meta.path.is_ident("crate") {
                found = Some(meta.value()?.parse::<Path>()?);
                Ok(())
            } else {
                Err(meta.error("expected `crate = path`"))
            }
        });
        if let Err(e) = syn::parse::Parser::parse(p, attr2) {
            return e.to_compile_error().into();
        }
        found
    };
    let krate: proc_macro2::TokenStream = match explicit {
        Some(p) => quote!(#p),
        None => match crate_name("mixer-registry") {
            Ok(FoundCrate::Itself) => quote!(crate),
            Ok(FoundCrate::Name(n)) => {
                let id = syn::Ident::new(&n, proc_macro2::Span::call_site());
                quote!(::#id)
            }
            Err(_) => match crate_name("mixers") {
                Ok(FoundCrate::Itself) => quote!(crate::registry),
                Ok(FoundCrate::Name(n)) => {
                    let id = syn::Ident::new(&n, proc_macro2::Span::call_site());
                    quote!(::#id::registry)
                }
                Err(_) => {
                    return syn::Error::new_spanned(
                        &item.ident,
                        "#[register] needs a dependency on `mixer-registry` or `mixers`",
                    )
                    .to_compile_error()
                    .into();
                }
            },
        },
    };
    let ty_name = match &*item.ty {
        Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default(),
        _ => String::new(),
    };
    let slice = match ty_name.as_str() {
        "PatternEntry" => "PATTERNS",
        "MaskEntry" => "MASKS",
        "LambdaEntry" => "LAMBDAS",
        "MixerEntry" => "MIXERS",
        "BackendEntry" => "BACKENDS",
        "FamilyEntry" => "FAMILIES",
        "LambdaGradEntry" => "LAMBDA_GRADS",
        other => {
            return syn::Error::new_spanned(
                &item.ty,
                format!(
                    "#[register] works on statics of type PatternEntry, MaskEntry, LambdaEntry, MixerEntry, \
                     BackendEntry, FamilyEntry or LambdaGradEntry; found `{other}`"
                ),
            )
            .to_compile_error()
            .into();
        }
    };
    let slice = syn::Ident::new(slice, proc_macro2::Span::call_site());
    // Next to the entry, its origin (the registering module), so that duplicate names and
    // linked plugins can be reported by crate.
    let ident = &item.ident;
    let origin = quote::format_ident!("__MIXERS_ORIGIN_OF_{}", ident);
    quote!(
        #[#krate::__linkme::distributed_slice(#krate::#slice)]
        #[linkme(crate = #krate::__linkme)]
        #item

        #[doc(hidden)]
        #[allow(non_upper_case_globals)]
        #[#krate::__linkme::distributed_slice(#krate::ORIGINS)]
        #[linkme(crate = #krate::__linkme)]
        static #origin: #krate::Origin = #krate::Origin { entry: &#ident, module: ::core::module_path!() };
    )
    .into()
}
