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

#[cfg(test)]
mod tests {
    use super::*;

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
