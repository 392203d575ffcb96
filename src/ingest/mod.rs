//! Prefix ingestion: files that already sit under an S3 prefix (or a local
//! folder), read as a table (`read_s3_prefix`) or landed as an Iceberg table
//! (`COPY INTO`), never by guesswork: a prefix with more than one candidate
//! file is refused unless files are pinned or all are opted into.
//!
//! [`source`] finds the files (credentials, listing, the guard), [`read`]
//! reads them (format, compression, schema), [`functions`] plans the table
//! functions, [`copy_into`] lands them exactly once per file.

pub(crate) mod by_file;
pub(crate) mod compression;
pub(crate) mod copy_into;
#[cfg(feature = "cluster")]
pub(crate) mod distribute;
pub(crate) mod functions;
pub(crate) mod options;
pub(crate) mod pages;
pub(crate) mod read;
pub(crate) mod records;
pub(crate) mod rejects;
pub(crate) mod shape;
pub(crate) mod source;
pub(crate) mod store;
pub(crate) mod write;

pub use options::{
    Compression, Format, MatchByName, OnError, Pattern, SchemaEvolution, SourceOptions,
    ValidationMode,
};
