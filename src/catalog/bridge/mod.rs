//! The bridge between Iceberg catalogs and DataFusion: DataFusion's view of
//! a catalog, read afresh on every lookup ([`provider`]), `INSERT INTO` and
//! appends of icestage's own rows ([`insert`]), and the one Parquet writer
//! every write goes through ([`writer`]).

pub(crate) mod insert;
pub(crate) mod provider;
pub(crate) mod writer;
