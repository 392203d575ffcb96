//! Session access tokens: what icestage's REST catalog accepts from a client
//! for one session's one table. A token is `<kind>.<session id>.<secret>`;
//! the session's table keeps only the SHA-256 of the secret (property
//! [`PROP_ACCESS_TOKEN`]), so the catalog holds no usable token and every
//! replica on the catalog accepts it. Issuing a new token replaces the old.

use std::collections::HashMap;

use iceberg::table::Table;
use sha2::{Digest, Sha256};

use super::PROP_STATE;
use crate::catalog::IcebergCatalog;
use crate::catalog::commit::{Swap, swap_properties};
use crate::error::Result;

/// Table property (staging and download tables): SHA-256 (hex) of the
/// secret of the session's current access token.
pub const PROP_ACCESS_TOKEN: &str = "icestage.access-token-sha256";

/// Which kind of session a token opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenKind {
    /// An upload: append to its staging table while it is open.
    Upload,
    /// A download: read its table once it is ready.
    Download,
}

impl TokenKind {
    fn tag(self) -> &'static str {
        match self {
            Self::Upload => "u",
            Self::Download => "d",
        }
    }

    /// `upload` or `download`, for messages and logs.
    pub(crate) fn tag_name(self) -> &'static str {
        match self {
            Self::Upload => "upload",
            Self::Download => "download",
        }
    }
}

/// A new token for session `id`, and the hash its table keeps.
fn issue(kind: TokenKind, id: &str) -> (String, String) {
    let secret = format!(
        "{:032x}{:032x}",
        rand::random::<u128>(),
        rand::random::<u128>()
    );
    let hash = digest(&secret);
    (format!("{}.{id}.{secret}", kind.tag()), hash)
}

/// A new token of `kind` for session `id`, whose table `table` then keeps
/// its hash, when `allowed` accepts the session's state (the value of its
/// `icestage.state` property); otherwise the state it is in.
pub(crate) async fn issue_on(
    catalog: &IcebergCatalog,
    table: &Table,
    kind: TokenKind,
    id: &str,
    allowed: impl Fn(&str) -> bool + Send + Sync + 'static,
) -> Result<std::result::Result<String, String>> {
    let (token, hash) = issue(kind, id);
    let accept = move |props: &HashMap<String, String>| {
        props.get(PROP_STATE).is_some_and(|state| allowed(state))
    };
    let swap = swap_properties(
        catalog,
        table,
        PROP_STATE,
        accept,
        HashMap::from([(PROP_ACCESS_TOKEN.to_string(), hash)]),
    )
    .await?;
    Ok(match swap {
        Swap::Done(_) => Ok(token),
        Swap::Refused(state) => Err(state),
    })
}

/// The kind, session id and secret of `token`, if it has a token's shape.
pub(crate) fn parse(token: &str) -> Option<(TokenKind, &str, &str)> {
    let mut parts = token.splitn(3, '.');
    let kind = match parts.next()? {
        "u" => TokenKind::Upload,
        "d" => TokenKind::Download,
        _ => return None,
    };
    let id = parts.next()?;
    let secret = parts.next()?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(id, 32) && hex(secret, 64)).then_some((kind, id, secret))
}

/// Whether `secret` is the one whose hash `kept` is, in constant time.
pub(crate) fn matches(secret: &str, kept: Option<&String>) -> bool {
    let Some(kept) = kept else {
        return false;
    };
    let presented = digest(secret);
    presented.len() == kept.len()
        && presented
            .bytes()
            .zip(kept.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

fn digest(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_only_their_secret_matches() {
        let id = format!("{:032x}", 7u128);
        let (token, hash) = issue(TokenKind::Upload, &id);
        let (kind, parsed_id, secret) = parse(&token).unwrap();
        assert_eq!((kind, parsed_id), (TokenKind::Upload, id.as_str()));
        assert!(matches(secret, Some(&hash)));
        let (other, _) = issue(TokenKind::Upload, &id);
        assert!(!matches(parse(&other).unwrap().2, Some(&hash)));
        assert!(!matches(secret, None));
        assert!(parse("u.short.secret").is_none());
        assert!(parse(&token.replacen('u', "x", 1)).is_none());
    }
}
