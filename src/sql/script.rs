//! Scripts: splitting text into statements and backslash commands, and
//! psql-style variables, shared by the shell and the sqllogictest runner.
//!
//! A statement ends at `;` or at `\gset [prefix]`, which runs it and stores
//! the columns of its single result row as variables (`prefix` + column
//! name). `:name` inserts a variable's value as is, `:'name'` as a quoted
//! SQL string and `:"name"` as a quoted identifier; nothing inside quotes or
//! comments is replaced, and an undefined `:name` stays as written.
//!
//! ```
//! use icestage::sql::script::{ScriptItem, Variables, split_script};
//!
//! let (items, rest) = split_script("CREATE UPLOAD FOR payments.t \\gset\nPROMOTE UPLOAD :'upload_id';");
//! assert!(rest.is_empty());
//! assert!(matches!(&items[0], ScriptItem::Sql { gset: Some(p), .. } if p.is_empty()));
//! let mut vars = Variables::default();
//! vars.set("upload_id", "4f2a");
//! let ScriptItem::Sql { text, .. } = &items[1] else { unreachable!() };
//! assert_eq!(vars.interpolate(text), "PROMOTE UPLOAD '4f2a'");
//! ```

use std::collections::BTreeMap;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};

use crate::error::{Error, Result};

/// One complete item of a script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptItem {
    /// A SQL statement, without its terminator.
    Sql {
        /// The statement text.
        text: String,
        /// `Some(prefix)` when it ended with `\gset [prefix]`.
        gset: Option<String>,
    },
    /// A backslash command on a line of its own, e.g. `\d`, `\set x 1`, `\q`.
    Meta(String),
}

/// Splits `text` into complete items; returns them and the unfinished rest
/// (a statement without its terminator yet).
pub fn split_script(text: &str) -> (Vec<ScriptItem>, String) {
    let mut items = vec![];
    let mut current = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                current.push(c);
                for q in chars.by_ref() {
                    current.push(q);
                    if q == c {
                        break;
                    }
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                // A comment runs to the end of the line; keep the newline.
                for q in chars.by_ref() {
                    if q == '\n' {
                        current.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut last = ' ';
                for q in chars.by_ref() {
                    if last == '*' && q == '/' {
                        break;
                    }
                    last = q;
                }
                current.push(' ');
            }
            ';' => {
                push_sql(&mut items, &mut current, None);
            }
            '\\' => {
                let mut line = String::from("\\");
                for q in chars.by_ref() {
                    if q == '\n' {
                        break;
                    }
                    line.push(q);
                }
                let line = line.trim_end().to_string();
                if current.trim().is_empty() {
                    current.clear();
                    items.push(ScriptItem::Meta(line));
                } else if let Some(prefix) = line.strip_prefix("\\gset") {
                    push_sql(&mut items, &mut current, Some(prefix.trim().to_string()));
                } else {
                    // Not a terminator: keep it as statement text.
                    current.push_str(&line);
                    current.push('\n');
                }
            }
            c => current.push(c),
        }
    }
    let rest = if current.trim().is_empty() {
        String::new()
    } else {
        current
    };
    (items, rest)
}

fn push_sql(items: &mut Vec<ScriptItem>, current: &mut String, gset: Option<String>) {
    let text = current.trim().to_string();
    current.clear();
    if !text.is_empty() {
        items.push(ScriptItem::Sql { text, gset });
    }
}

/// psql-style variables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Variables(BTreeMap<String, String>);

impl Variables {
    /// Sets `name` to `value`.
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.0.insert(name.into(), value.into());
    }

    /// Removes `name`.
    pub fn unset(&mut self, name: &str) {
        self.0.remove(name);
    }

    /// The value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// Every variable, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Replaces `:name`, `:'name'` and `:"name"` in `sql`; see the module docs.
    pub fn interpolate(&self, sql: &str) -> String {
        self.interpolated(sql).0
    }

    /// The variables `sql` names that are not set (they stay as written).
    pub fn missing(&self, sql: &str) -> Vec<String> {
        self.interpolated(sql).1
    }

    fn interpolated(&self, sql: &str) -> (String, Vec<String>) {
        let mut missing = vec![];
        let mut out = String::with_capacity(sql.len());
        let chars: Vec<char> = sql.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            match c {
                '\'' | '"' => {
                    let end = chars[i + 1..]
                        .iter()
                        .position(|q| *q == c)
                        .map_or(chars.len(), |p| i + 1 + p + 1);
                    out.extend(&chars[i..end]);
                    i = end;
                }
                '-' if chars.get(i + 1) == Some(&'-') => {
                    let end = chars[i..]
                        .iter()
                        .position(|q| *q == '\n')
                        .map_or(chars.len(), |p| i + p);
                    out.extend(&chars[i..end]);
                    i = end;
                }
                ':' if chars.get(i + 1) == Some(&':') => {
                    out.push_str("::");
                    i += 2;
                }
                ':' => match self.variable_at(&chars, i + 1) {
                    Ok((replacement, next)) => {
                        out.push_str(&replacement);
                        i = next;
                    }
                    Err(name) => {
                        missing.extend(name);
                        out.push(':');
                        i += 1;
                    }
                },
                c => {
                    out.push(c);
                    i += 1;
                }
            }
        }
        (out, missing)
    }

    /// The replacement for a reference starting at `chars[start]` (just
    /// after the colon) and the index after it, if it names a variable.
    /// The replacement of the variable named at `start` and where it ends;
    /// `Err(Some(name))` for a variable that is not set, `Err(None)` where
    /// no variable is named.
    fn variable_at(
        &self,
        chars: &[char],
        start: usize,
    ) -> std::result::Result<(String, usize), Option<String>> {
        let quote = match chars.get(start) {
            Some('\'') => Some('\''),
            Some('"') => Some('"'),
            _ => None,
        };
        let name_start = start + usize::from(quote.is_some());
        let name_len = chars[name_start..]
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric() || **c == '_')
            .count();
        if name_len == 0 {
            return Err(None);
        }
        let name: String = chars[name_start..name_start + name_len].iter().collect();
        let mut next = name_start + name_len;
        if let Some(q) = quote {
            if chars.get(next) != Some(&q) {
                return Err(None);
            }
            next += 1;
        }
        let Some(value) = self.get(&name) else {
            return Err(Some(name));
        };
        let replacement = match quote {
            Some('\'') => format!("'{}'", value.replace('\'', "''")),
            Some(_) => format!("\"{}\"", value.replace('"', "\"\"")),
            None => value.to_string(),
        };
        Ok((replacement, next))
    }

    /// `\gset`: stores each column of the single row of `batches` as
    /// `prefix` + column name. A NULL unsets the variable.
    pub fn set_from_result(&mut self, prefix: &str, batches: &[RecordBatch]) -> Result<()> {
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        if rows != 1 {
            return Err(Error::invalid(format!(
                "\\gset needs a result of exactly one row, the statement returned {rows}: \
                 narrow it with WHERE or LIMIT 1"
            )));
        }
        let batch = batches.iter().find(|b| b.num_rows() == 1).expect("one row");
        let options = FormatOptions::default();
        for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
            let name = format!("{prefix}{}", field.name());
            if column.is_null(0) {
                self.unset(&name);
                continue;
            }
            let formatter = ArrayFormatter::try_new(column.as_ref(), &options)?;
            self.set(name, formatter.value(0).to_string());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sql(text: &str) -> ScriptItem {
        ScriptItem::Sql {
            text: text.to_string(),
            gset: None,
        }
    }

    #[test]
    fn splits_on_semicolons_outside_quotes_and_comments() {
        let (items, rest) = split_script(
            "SELECT ';' AS a; -- a comment; still comment\nSELECT \"x;y\" FROM t;\n/* ; */ SELECT 2",
        );
        assert_eq!(
            items,
            vec![sql("SELECT ';' AS a"), sql("SELECT \"x;y\" FROM t")]
        );
        assert_eq!(rest.trim(), "SELECT 2");
    }

    #[test]
    fn gset_and_meta_commands() {
        let (items, rest) = split_script("\\d\nCREATE UPLOAD FOR t \\gset up_\n\\set x 1\n");
        assert_eq!(
            items,
            vec![
                ScriptItem::Meta("\\d".to_string()),
                ScriptItem::Sql {
                    text: "CREATE UPLOAD FOR t".to_string(),
                    gset: Some("up_".to_string()),
                },
                ScriptItem::Meta("\\set x 1".to_string()),
            ]
        );
        assert!(rest.is_empty());
    }

    #[test]
    fn interpolation() {
        let mut vars = Variables::default();
        vars.set("t", "staging.upload_1");
        vars.set("id", "it's");
        assert_eq!(
            vars.interpolate("INSERT INTO :t SELECT :'id', ':t', x::int, :missing, :\"id\""),
            "INSERT INTO staging.upload_1 SELECT 'it''s', ':t', x::int, :missing, \"it's\""
        );
        assert_eq!(
            vars.missing("SELECT :t, :'gone', ':quoted', x::int, :missing"),
            vec!["gone".to_string(), "missing".to_string()]
        );
    }
}
