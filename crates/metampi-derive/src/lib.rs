//! `#[derive(Equivalence)]` for metampi: describes a plain struct's fields as
//! an MPI structured datatype, so values of it can be sent and received.
//!
//! Supported field types: any type that implements `Equivalence`, arrays
//! `[T; N]` and tuples of supported types (nested freely).

use proc_macro::TokenStream;
use proc_macro2::TokenStream as Tokens;
use quote::{quote, ToTokens};
use syn::{parse_macro_input, Data, DeriveInput, Fields, Index, Type};

/// Derives `metampi::datatype::Equivalence` for a struct.
#[proc_macro_derive(Equivalence)]
pub fn derive_equivalence(input: TokenStream) -> TokenStream {
    let ast = parse_macro_input!(input as DeriveInput);
    match expand(&ast) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// The path of the metampi crate as the user's Cargo.toml names it, so the
/// derive works when rsmpi programs rename it (`mpi = { package = "metampi" }`).
fn crate_path() -> Tokens {
    use proc_macro_crate::{crate_name, FoundCrate};
    match crate_name("metampi") {
        Ok(FoundCrate::Name(name)) => {
            let id = proc_macro2::Ident::new(&name, proc_macro2::Span::call_site());
            quote!(::#id)
        }
        // Inside metampi itself (its tests and examples) and when lookup fails.
        _ => quote!(::metampi),
    }
}

fn expand(ast: &DeriveInput) -> syn::Result<Tokens> {
    let Data::Struct(data) = &ast.data else {
        return Err(syn::Error::new_spanned(
            ast,
            "Equivalence can only be derived for structs",
        ));
    };
    if !ast.generics.params.is_empty() {
        return Err(syn::Error::new_spanned(
            &ast.generics,
            "Equivalence cannot be derived for generic structs",
        ));
    }
    let ident = &ast.ident;
    let fields: Vec<(Tokens, &Type)> = match &data.fields {
        Fields::Named(f) => f
            .named
            .iter()
            .map(|f| (f.ident.to_token_stream(), &f.ty))
            .collect(),
        Fields::Unnamed(f) => f
            .unnamed
            .iter()
            .enumerate()
            .map(|(i, f)| (Index::from(i).to_token_stream(), &f.ty))
            .collect(),
        Fields::Unit => Vec::new(),
    };
    let krate = crate_path();
    let mut dts = Vec::new();
    for (_, ty) in &fields {
        dts.push(datatype_of(ty, &krate)?);
    }
    let offsets = fields
        .iter()
        .map(|(name, _)| quote!(::core::mem::offset_of!(#ident, #name) as #krate::Address));
    let ones = fields.iter().map(|_| quote!(1));
    Ok(quote! {
        // SAFETY: the datatype lists every field at its real offset with the
        // field's own datatype, so it describes exactly the data bytes.
        unsafe impl #krate::datatype::Equivalence for #ident {
            type Out = #krate::datatype::DatatypeRef<'static>;
            fn equivalent_datatype() -> Self::Out {
                static DT: ::std::sync::OnceLock<#krate::datatype::DatatypeRef<'static>> = ::std::sync::OnceLock::new();
                *DT.get_or_init(|| {
                    let dt = #krate::datatype::UserDatatype::structured::<#krate::datatype::DatatypeRef<'static>>(
                        &[#(#ones),*],
                        &[#(#offsets),*],
                        &[#(#dts),*],
                    );
                    #krate::datatype::__resized(#krate::datatype::__leak(dt), ::core::mem::size_of::<#ident>())
                })
            }
        }
    })
}

/// An expression of type `DatatypeRef<'static>` for a field type.
fn datatype_of(ty: &Type, krate: &Tokens) -> syn::Result<Tokens> {
    Ok(match ty {
        Type::Array(a) => {
            let elem = datatype_of(&a.elem, krate)?;
            let len = &a.len;
            let ety = &a.elem;
            quote!(#krate::datatype::__resized(
                #krate::datatype::__leak(#krate::datatype::UserDatatype::contiguous((#len) as #krate::Count, &#elem)),
                ::core::mem::size_of::<[#ety; #len]>()
            ))
        }
        Type::Tuple(t) if t.elems.is_empty() => {
            return Err(syn::Error::new_spanned(
                ty,
                "unit fields carry no data; remove them",
            ));
        }
        Type::Tuple(t) => {
            let elems: Vec<Tokens> = t
                .elems
                .iter()
                .map(|e| datatype_of(e, krate))
                .collect::<syn::Result<_>>()?;
            let idx = (0..t.elems.len()).map(Index::from);
            let ones = t.elems.iter().map(|_| quote!(1));
            quote!(#krate::datatype::__resized(
                #krate::datatype::__leak(#krate::datatype::UserDatatype::structured(
                    &[#(#ones),*],
                    &[#(::core::mem::offset_of!(#t, #idx) as #krate::Address),*],
                    &[#(#elems),*],
                )),
                ::core::mem::size_of::<#t>()
            ))
        }
        Type::Paren(p) => datatype_of(&p.elem, krate)?,
        Type::Path(_) => {
            quote!(#krate::datatype::__ref(&<#ty as #krate::datatype::Equivalence>::equivalent_datatype()))
        }
        other => {
            return Err(syn::Error::new_spanned(
                other,
                "unsupported field type for Equivalence",
            ))
        }
    })
}
