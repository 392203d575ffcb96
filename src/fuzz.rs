//! Entry points for the parser fuzz harness (`fuzz/`): each takes bytes a
//! client could write and runs them through exactly the functions icestage
//! decodes them with (bounds, guards and all). An `Err` is a refusal
//! (fine); a panic is a finding: it would kill the task that decodes.
//!
//! Not part of the supported API.

use iceberg::spec::{FormatVersion, TableMetadata};

/// The bound the harness gives decompression (small, so a run stays fast).
const INFLATE_BOUND: u64 = 16 << 20;

/// One target: bytes in, a refusal's text or nothing out.
pub type Target = fn(&[u8]) -> Result<(), String>;

/// The targets, by the name `fuzz/run.sh` uses.
pub const TARGETS: &[(&str, Target)] = &[
    ("avro-container", avro_container),
    ("manifest-list", manifest_list),
    ("manifest", manifest),
    ("table-metadata", table_metadata),
    ("parquet-footer", parquet_footer),
    ("parquet-pages", parquet_pages),
];

/// The Avro container guard alone.
pub fn avro_container(bytes: &[u8]) -> Result<(), String> {
    crate::catalog::manifests::check_container(bytes, INFLATE_BOUND)
}

/// A manifest list, as a session's commit names it (v1 and v2).
pub fn manifest_list(bytes: &[u8]) -> Result<(), String> {
    avro_container(bytes)?;
    for version in [FormatVersion::V1, FormatVersion::V2] {
        crate::catalog::manifests::decode_list(bytes, version, "input")
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// A manifest, as a manifest list names it.
pub fn manifest(bytes: &[u8]) -> Result<(), String> {
    avro_container(bytes)?;
    crate::catalog::manifests::decode_manifest(bytes, "input")
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A table metadata file, as a catalog loads it.
pub fn table_metadata(bytes: &[u8]) -> Result<(), String> {
    serde_json::from_slice::<TableMetadata>(bytes)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A staged file's Parquet footer (the Thrift bytes before the last 8),
/// decoded as verification decodes it.
pub fn parquet_footer(bytes: &[u8]) -> Result<(), String> {
    crate::upload::validation::verify::decode_footer(bytes, "input")
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A staged file's column chunk (its pages, headers and data), walked as
/// the page guard walks it before the `parquet` crate decodes it, under
/// each codec a writer may name.
pub fn parquet_pages(bytes: &[u8]) -> Result<(), String> {
    use parquet::basic::Compression;
    let codecs = [
        Compression::UNCOMPRESSED,
        Compression::SNAPPY,
        Compression::GZIP(Default::default()),
        Compression::BROTLI(Default::default()),
        Compression::LZ4,
        Compression::ZSTD(Default::default()),
        Compression::LZ4_RAW,
    ];
    crate::limits::pages::check_pages(bytes, 4, &codecs, INFLATE_BOUND)
}
