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
    let mut dts = Vec::new();
    for (_, ty) in &fields {
        dts.push(datatype_of(ty)?);
    }
    let offsets = fields
        .iter()
        .map(|(name, _)| quote!(::core::mem::offset_of!(#ident, #name) as ::metampi::Address));
    let ones = fields.iter().map(|_| quote!(1));
    Ok(quote! {
        // SAFETY: the datatype lists every field at its real offset with the
        // field's own datatype, so it describes exactly the data bytes.
        unsafe impl ::metampi::datatype::Equivalence for #ident {
            type Out = ::metampi::datatype::DatatypeRef<'static>;
            fn equivalent_datatype() -> Self::Out {
                static DT: ::std::sync::OnceLock<::metampi::datatype::DatatypeRef<'static>> = ::std::sync::OnceLock::new();
                *DT.get_or_init(|| {
                    let dt = ::metampi::datatype::UserDatatype::structured(
                        &[#(#ones),*],
                        &[#(#offsets),*],
                        &[#(#dts),*],
                    );
                    ::metampi::datatype::__resized(::metampi::datatype::__leak(dt), ::core::mem::size_of::<#ident>())
                })
            }
        }
    })
}

/// An expression of type `DatatypeRef<'static>` for a field type.
fn datatype_of(ty: &Type) -> syn::Result<Tokens> {
    Ok(match ty {
        Type::Array(a) => {
            let elem = datatype_of(&a.elem)?;
            let len = &a.len;
            let ety = &a.elem;
            quote!(::metampi::datatype::__resized(
                ::metampi::datatype::__leak(::metampi::datatype::UserDatatype::contiguous((#len) as ::metampi::Count, &#elem)),
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
                .map(datatype_of)
                .collect::<syn::Result<_>>()?;
            let idx = (0..t.elems.len()).map(Index::from);
            let ones = t.elems.iter().map(|_| quote!(1));
            quote!(::metampi::datatype::__resized(
                ::metampi::datatype::__leak(::metampi::datatype::UserDatatype::structured(
                    &[#(#ones),*],
                    &[#(::core::mem::offset_of!(#t, #idx) as ::metampi::Address),*],
                    &[#(#elems),*],
                )),
                ::core::mem::size_of::<#t>()
            ))
        }
        Type::Paren(p) => datatype_of(&p.elem)?,
        Type::Path(_) => {
            quote!(::metampi::datatype::__ref(&<#ty as ::metampi::datatype::Equivalence>::equivalent_datatype()))
        }
        other => {
            return Err(syn::Error::new_spanned(
                other,
                "unsupported field type for Equivalence",
            ))
        }
    })
}
