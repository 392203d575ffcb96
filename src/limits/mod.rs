//! Bounds on the work icestage does on bytes a client wrote (metadata JSON,
//! manifest lists, manifests, Parquet footers and pages, compressed ingest
//! sources).
//!
//! A client's file is read only when its stored size is within its bound,
//! and decompressed only up to its inflation bound: a file past either is
//! an error that names it and the bound, never memory or disk spent on it.
//! The bounds are process-wide (the reads happen deep inside catalog code
//! that has no session at hand): `register` sets them from the `[limits]`
//! table of a catalog or service configuration, before any read.

pub(crate) mod pages;

use std::sync::RwLock;

use serde::Deserialize;

/// How much of a client's bytes icestage reads at most. The defaults fit
/// real tables with room to spare: a manifest of 100,000 data files is
/// about 30 MB uncompressed, a Parquet footer of 10,000 row groups a few MB.
///
/// ```toml
/// [limits]
/// metadata_bytes = 67108864          # 64 MiB stored
/// metadata_inflated_bytes = 268435456 # 256 MiB once decompressed
/// page_inflated_bytes = 268435456     # one Parquet page, decompressed
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReadLimits {
    /// The largest metadata file (table metadata JSON, manifest list,
    /// manifest) read on a client's behalf, in bytes as stored.
    pub metadata_bytes: u64,
    /// The most bytes one such file may decompress to.
    pub metadata_inflated_bytes: u64,
    /// The largest Parquet footer of a staged file, in bytes.
    pub footer_bytes: u64,
    /// The most bytes one page of a client's Parquet file (a staged file, a
    /// `COPY INTO` or pipe source) may decompress to. Writers cut pages at
    /// about 1 MiB; a page holding one very large value is larger.
    pub page_inflated_bytes: u64,
    /// The most bytes one compressed ingest source (`COPY INTO`, pipes) may
    /// decompress to.
    pub source_inflated_bytes: u64,
}

impl Default for ReadLimits {
    fn default() -> Self {
        Self {
            metadata_bytes: 64 << 20,
            metadata_inflated_bytes: 256 << 20,
            footer_bytes: 16 << 20,
            page_inflated_bytes: 256 << 20,
            source_inflated_bytes: 64 << 30,
        }
    }
}

static LIMITS: RwLock<Option<ReadLimits>> = RwLock::new(None);

/// The bounds in force in this process.
pub fn current() -> ReadLimits {
    LIMITS
        .read()
        .map(|l| l.unwrap_or_default())
        .unwrap_or_default()
}

/// Sets the bounds of this process (the last configuration opened wins).
pub(crate) fn install(limits: ReadLimits) {
    if let Ok(mut slot) = LIMITS.write() {
        *slot = Some(limits);
    }
}

/// `bytes` in a short human form for messages (`64 MiB`).
pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{} {unit}", bytes / size);
        }
    }
    format!("{bytes} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_read_from_toml_keep_their_defaults_for_what_is_unset() {
        let limits: ReadLimits = toml::from_str("metadata_bytes = 1024").unwrap();
        assert_eq!(limits.metadata_bytes, 1024);
        assert_eq!(limits.footer_bytes, ReadLimits::default().footer_bytes);
        let error = toml::from_str::<ReadLimits>("metadata_byte = 1").unwrap_err();
        assert!(error.to_string().contains("unknown field"), "{error}");
        assert_eq!(human(64 << 20), "64 MiB");
        assert_eq!(human(1000), "1000 bytes");
    }
}
