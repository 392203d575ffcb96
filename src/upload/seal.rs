//! The seal on a session's authority.
//!
//! An upload's target, owner, creation and expiry times live in its staging
//! table's properties, which the client's credentials can rewrite. So
//! `CREATE UPLOAD` seals them: `icestage.seal` is an HMAC-SHA256 over those
//! values under a key the client cannot read, kept in the properties of the
//! catalog's icestage-owned upload log (on S3 Tables a session's credentials
//! reach its one table; on a SQL catalog the connection is the whole catalog,
//! so there the seal only catches accidents: trusted clients only). Every
//! process sharing the catalog finds the same key, created once by
//! compare-and-swap.
//!
//! The session's state is not sealed: a client that rewrites it can at most
//! confuse its own status. Promotion's claim is a compare-and-swap, the
//! exactly-once evidence lives in the target, and staged files are never
//! registered in place where a client could still write them.

use std::collections::HashMap;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{PROP_CREATED_AT, PROP_EXPIRES_AT, PROP_OWNER, PROP_TARGET, PROP_UPLOAD_ID};
use crate::catalog::IcebergCatalog;
use crate::catalog::commit::{Swap, swap_properties};
use crate::error::{Error, Result};
use crate::session::log;

/// Staging table property: the seal over the session's authority.
pub const PROP_SEAL: &str = "icestage.seal";
/// Upload log property: the catalog's sealing key (hex).
const PROP_SEAL_KEY: &str = "icestage.seal-key";
/// Staging table property (sealed): how the upload's exactly-once evidence
/// is proven. [`PROOF_V1`]: the target snapshot that promoted it carries
/// [`SNAPSHOT_UPLOAD_PROOF`] beside `upload-id`. Uploads opened before it
/// existed lack it, and their evidence is `upload-id` alone.
pub const PROP_EVIDENCE: &str = "icestage.evidence";
/// [`PROP_EVIDENCE`]'s value: an HMAC proof ([`proof`]).
pub(crate) const PROOF_V1: &str = "upload-proof-v1";
/// Target snapshot property: the proof that the snapshot carrying
/// `upload-id=<id>` is icestage's promotion of that upload ([`proof`]).
pub const SNAPSHOT_UPLOAD_PROOF: &str = "upload-proof";

/// The properties a seal covers, in order.
const SEALED: [&str; 5] = [
    PROP_UPLOAD_ID,
    PROP_TARGET,
    PROP_OWNER,
    PROP_CREATED_AT,
    PROP_EXPIRES_AT,
];

/// The catalog's sealing key: read from the upload log's properties, or
/// created there (one winner when processes race).
pub(crate) async fn key(catalog: &IcebergCatalog) -> Result<Vec<u8>> {
    catalog
        .seal_key()
        .get_or_try_init(|| async {
            let table = log::log_table(catalog, log::UPLOADS).await?;
            if let Some(key) = table.metadata().properties().get(PROP_SEAL_KEY) {
                return decode(key);
            }
            let fresh = hex::encode(rand::random::<[u8; 32]>());
            let table = match swap_properties(
                catalog,
                &table,
                PROP_SEAL_KEY,
                |props| !props.contains_key(PROP_SEAL_KEY),
                HashMap::from([(PROP_SEAL_KEY.to_string(), fresh)]),
            )
            .await?
            {
                Swap::Done(table) => table,
                // Another process set it first: use theirs.
                Swap::Refused(_) => log::log_table(catalog, log::UPLOADS).await?,
            };
            table
                .metadata()
                .properties()
                .get(PROP_SEAL_KEY)
                .map(|k| decode(k))
                .unwrap_or_else(|| {
                    Err(Error::internal(
                        "the upload log has no sealing key after setting one",
                    ))
                })
        })
        .await
        .cloned()
}

fn decode(key: &str) -> Result<Vec<u8>> {
    hex::decode(key).map_err(|_| {
        Error::invalid(format!(
            "the upload log's '{PROP_SEAL_KEY}' property is not hex: it was changed outside \
             icestage; remove it to have a new key made (open uploads will then fail their seal)"
        ))
    })
}

fn mac(key: &[u8], props: &HashMap<String, String>) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    for name in SEALED {
        let value = props.get(name).map(String::as_str).unwrap_or_default();
        // Length-prefixed, so that values cannot run into each other.
        mac.update(&(value.len() as u64).to_be_bytes());
        mac.update(value.as_bytes());
    }
    // Sealed when present (uploads opened before it existed keep their
    // seal): removing it breaks the seal as changing it does.
    if let Some(evidence) = props.get(PROP_EVIDENCE) {
        mac.update(PROP_EVIDENCE.as_bytes());
        mac.update(&(evidence.len() as u64).to_be_bytes());
        mac.update(evidence.as_bytes());
    }
    mac
}

/// The proof a target snapshot carries that it promoted upload `id` into
/// `target`: an HMAC under the catalog's sealing key, which whoever else
/// commits to the target (another engine, a catalog token) cannot read, so
/// a snapshot that merely says `upload-id=<id>` proves nothing.
pub(crate) fn proof(key: &[u8], id: &str, target: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    for part in ["upload-evidence", id, target] {
        mac.update(&(part.len() as u64).to_be_bytes());
        mac.update(part.as_bytes());
    }
    hex::encode(mac.finalize().into_bytes())
}

/// The seal of `props` (the sealed properties of a new staging table).
pub(crate) fn seal(key: &[u8], props: &HashMap<String, String>) -> String {
    hex::encode(mac(key, props).finalize().into_bytes())
}

/// `None` when `props` carry a valid seal; otherwise what is wrong, for the
/// user. Compared in constant time.
pub(crate) fn broken(key: &[u8], props: &HashMap<String, String>) -> Option<String> {
    let Some(seal) = props.get(PROP_SEAL) else {
        return Some(format!(
            "its staging table has no '{PROP_SEAL}' property: it was removed, or the upload was \
             opened by an older icestage"
        ));
    };
    let valid = hex::decode(seal).is_ok_and(|bytes| mac(key, props).verify_slice(&bytes).is_ok());
    (!valid).then(|| {
        format!(
            "its staging table's icestage properties ({}) were changed after CREATE UPLOAD: \
             a client rewrote them",
            SEALED.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_target_or_expiry_breaks_the_seal() {
        let key = b"0123456789abcdef0123456789abcdef";
        let mut props = HashMap::from([
            (PROP_UPLOAD_ID.to_string(), "a".repeat(32)),
            (PROP_TARGET.to_string(), "s.t".to_string()),
            (
                PROP_EXPIRES_AT.to_string(),
                "2026-12-01T00:00:00+00:00".to_string(),
            ),
        ]);
        props.insert(PROP_SEAL.to_string(), seal(key, &props));
        assert_eq!(broken(key, &props), None);
        let mut moved = props.clone();
        moved.insert(PROP_TARGET.to_string(), "s.other".to_string());
        assert!(broken(key, &moved).unwrap().contains("were changed"));
        let mut later = props.clone();
        later.insert(
            PROP_EXPIRES_AT.to_string(),
            "2099-01-01T00:00:00+00:00".to_string(),
        );
        assert!(broken(key, &later).is_some());
        let mut shifted = props.clone();
        shifted.insert(PROP_TARGET.to_string(), "s.".to_string());
        shifted.insert(PROP_OWNER.to_string(), "t".to_string());
        assert!(broken(key, &shifted).is_some());
        assert!(broken(b"another key", &props).is_some());
        // The evidence marker is sealed once present: removing it breaks
        // the seal.
        let mut marked = props.clone();
        marked.insert(PROP_EVIDENCE.to_string(), PROOF_V1.to_string());
        marked.insert(PROP_SEAL.to_string(), seal(key, &marked));
        assert_eq!(broken(key, &marked), None);
        marked.remove(PROP_EVIDENCE);
        assert!(broken(key, &marked).is_some());
        assert_ne!(proof(key, "a", "s.t"), proof(key, "a", "s.u"));
        assert_ne!(proof(key, "a", "s.t"), proof(b"another key", "a", "s.t"));
        props.remove(PROP_SEAL);
        assert!(broken(key, &props).unwrap().contains("no 'icestage.seal'"));
    }
}
