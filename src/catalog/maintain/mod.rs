//! Keeping tables in shape: merging manifests ([`compact`]), rewriting
//! small data files ([`bin_pack`]), finding files nothing references
//! ([`orphans`]), and the upkeep an append leaves due, run in the
//! background ([`upkeep`]). Nothing here is called by the commit protocol;
//! it reports appends ([`crate::catalog::IcebergCatalog::appended`]) and
//! this folder acts on them.

pub(crate) mod bin_pack;
pub(crate) mod compact;
pub(crate) mod orphans;
pub(crate) mod upkeep;
