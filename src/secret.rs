//! A secret value that never prints.

use std::fmt;

/// A secret (secret access key, session token): `Debug` and `Display` print
/// `***`; [`Secret::expose`] is the only way to the value.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret value, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl<'de> serde::Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Secret::new)
    }
}

/// True for property keys whose values are secrets.
pub(crate) fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["secret", "token", "password", "credential"]
        .iter()
        .any(|word| key.contains(word))
}

/// `properties` with secret values replaced by `***`, for `Debug` output.
pub(crate) fn redacted<'a>(
    properties: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Vec<(&'a str, &'a str)> {
    properties
        .into_iter()
        .map(|(k, v)| {
            (
                k.as_str(),
                if is_secret_key(k) { "***" } else { v.as_str() },
            )
        })
        .collect()
}

/// `sql` with the value of every secret-named argument or option
/// (`secret_access_key => '...'`, `session_token = '...'`) replaced by
/// `'***'`, for SQL text that is stored or shown (a download's query).
pub(crate) fn redact_sql(sql: &str) -> String {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize() else {
        // Not tokenizable: store nothing that could hold a secret.
        return "<query text withheld: it could not be checked for secrets>".to_string();
    };
    let mut out = String::with_capacity(sql.len());
    let mut secret_named = false;
    for token in tokens {
        match &token {
            Token::Whitespace(_) => {}
            Token::Word(word) => secret_named = is_secret_key(&word.value),
            Token::RArrow | Token::Eq | Token::Assignment | Token::Colon if secret_named => {}
            Token::SingleQuotedString(_) | Token::DoubleQuotedString(_) if secret_named => {
                out.push_str("'***'");
                secret_named = false;
                continue;
            }
            _ => secret_named = false,
        }
        out.push_str(&token.to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_in_sql_text_are_redacted() {
        let sql = "SELECT * FROM read_s3_prefix('s3://b/p/', access_key_id => 'AKIA1', \
                   secret_access_key => 'wJalr', session_token => 'FQo') WHERE note = 'token'";
        let redacted = redact_sql(sql);
        assert!(
            !redacted.contains("wJalr") && !redacted.contains("FQo"),
            "{redacted}"
        );
        assert!(
            redacted.contains("secret_access_key => '***'"),
            "{redacted}"
        );
        assert!(
            redacted.contains("'AKIA1'") && redacted.contains("note = 'token'"),
            "{redacted}"
        );
    }

    #[test]
    fn secrets_never_print() {
        let secret = Secret::new("wJalrXUtnFEMI");
        assert_eq!(format!("{secret}"), "***");
        assert_eq!(format!("{secret:?}"), "***");
        assert_eq!(secret.expose(), "wJalrXUtnFEMI");
        assert!(is_secret_key("s3.secret-access-key"));
        assert!(is_secret_key("session_token"));
        assert!(!is_secret_key("s3.access-key-id"));
    }
}
