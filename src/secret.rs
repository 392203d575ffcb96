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

/// Whether `a` and `b` are equal, in time that depends on their length only
/// (for secrets, hashes and proofs).
pub(crate) fn equal_time(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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

/// Replaces, in `query` as parsed, the value of every secret-named
/// function argument (`secret_access_key => <any expression>`: a string,
/// an array, a concatenation) and every value that follows a secret-named
/// string key (`named_struct('session_token', ...)`, `MAP {'token': ...}`)
/// with `'***'`, at any depth. The parsed form, not the text, decides: no
/// spelling of a literal gets a secret past it.
pub(crate) fn redact_query(query: &mut datafusion::sql::sqlparser::ast::Query) {
    use std::ops::ControlFlow;

    use datafusion::sql::sqlparser::ast::{
        Expr, FunctionArg, FunctionArgExpr, FunctionArguments, TableFactor, Value, VisitMut,
        VisitorMut,
    };

    fn hidden() -> Expr {
        Expr::value(Value::SingleQuotedString("***".to_string()))
    }
    fn secret_literal(expr: &Expr) -> bool {
        match expr {
            Expr::Value(v) => match &v.value {
                Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => is_secret_key(s),
                _ => false,
            },
            _ => false,
        }
    }
    fn redact_args(args: &mut [FunctionArg]) {
        let mut after_key = false;
        for arg in args {
            let (named_secret, value) = match arg {
                FunctionArg::Named { name, arg, .. } => (is_secret_key(&name.value), arg),
                FunctionArg::ExprNamed { name, arg, .. } => (
                    secret_literal(name) || name.to_string().split('.').any(is_secret_key),
                    arg,
                ),
                FunctionArg::Unnamed(arg) => (false, arg),
            };
            let is_key = matches!(value, FunctionArgExpr::Expr(e) if secret_literal(e));
            if named_secret || after_key {
                *value = FunctionArgExpr::Expr(hidden());
            }
            after_key = is_key && !named_secret;
        }
    }
    struct Redactor;
    impl VisitorMut for Redactor {
        type Break = ();
        fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
            match factor {
                TableFactor::Table {
                    args: Some(args), ..
                } => redact_args(&mut args.args),
                TableFactor::Function { args, .. } => redact_args(args),
                _ => {}
            }
            ControlFlow::Continue(())
        }
        fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
            match expr {
                Expr::Function(function) => {
                    if let FunctionArguments::List(list) = &mut function.args {
                        redact_args(&mut list.args);
                    }
                }
                Expr::Map(map) => {
                    for entry in &mut map.entries {
                        if secret_literal(&entry.key) {
                            *entry.value = hidden();
                        }
                    }
                }
                Expr::Named { name, expr: value } if is_secret_key(&name.value) => {
                    **value = hidden();
                }
                _ => {}
            }
            ControlFlow::Continue(())
        }
    }
    let _ = query.visit(&mut Redactor);
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

    /// Every literal form of a secret is redacted from the parsed query:
    /// arrays, concatenations, casts, nested calls, struct and map keys.
    #[test]
    fn secrets_in_a_parsed_query_are_redacted_whatever_their_form() {
        use datafusion::sql::sqlparser::ast::Statement;
        use datafusion::sql::sqlparser::dialect::GenericDialect;
        use datafusion::sql::sqlparser::parser::Parser;
        let sql = "SELECT named_struct('session_token', 'S3', 'x', 'kept1') AS n \
                   FROM read_s3_prefix('s3://b/p/', secret_access_key => ['S1'], \
                   session_token => 'S' || '2', access_key_id => 'AKIA1') \
                   WHERE note = 'token' AND f(password => CAST('S4' AS VARCHAR)) \
                   AND g(MAP {'secret': 'S5', 'other': 'kept2'})";
        let Statement::Query(mut query) = Parser::parse_sql(&GenericDialect {}, sql)
            .unwrap()
            .remove(0)
        else {
            panic!("a query")
        };
        redact_query(&mut query);
        let text = query.to_string();
        for secret in ["S1", "'S' || '2'", "S3", "S4", "S5"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        for kept in ["AKIA1", "note = 'token'", "kept1", "kept2"] {
            assert!(text.contains(kept), "{kept} missing from {text}");
        }
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
