//! What `icestage serve` logs on stderr: one line per request (target
//! `icestage::request`) and one per state change of an upload or download
//! (target `icestage::state`), as text or as JSON (`[service] log_format`).
//!
//! Lines are filtered as `RUST_LOG` filters: `ICESTAGE_LOG` (or, unset,
//! `RUST_LOG`) holds comma-separated directives, each a level (`warn`) or a
//! target prefix and a level (`icestage::request=off`); the longest prefix
//! that matches a line's target decides; `info` when nothing is set. A
//! line names the caller by its token's name or its session's id: never a
//! secret, a token or a key.

use std::sync::OnceLock;

use serde_json::{Map, Value, json};

/// How severe a line is, most severe first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    Off,
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl Level {
    fn parse(text: &str) -> Option<Self> {
        Some(match text.trim().to_ascii_lowercase().as_str() {
            "off" => Self::Off,
            "error" => Self::Error,
            "warn" => Self::Warn,
            "info" => Self::Info,
            "debug" => Self::Debug,
            "trace" => Self::Trace,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::Off => "OFF",
            Self::Error => "ERROR",
            Self::Warn => "WARN",
            Self::Info => "INFO",
            Self::Debug => "DEBUG",
            Self::Trace => "TRACE",
        }
    }
}

/// A `RUST_LOG`-style filter: the most verbose level shown per target
/// prefix (the empty prefix for every target).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Filter(Vec<(String, Level)>);

impl Filter {
    /// The filter `directives` spell; a directive that is not one is
    /// left out (as `RUST_LOG` does), and nothing at all means `info`.
    pub(crate) fn parse(directives: &str) -> Self {
        let mut rules = vec![(String::new(), Level::Info)];
        for directive in directives
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
        {
            let rule = match directive.split_once('=') {
                Some((target, level)) => {
                    Level::parse(level).map(|l| (target.trim().to_string(), l))
                }
                None => match Level::parse(directive) {
                    Some(level) => Some((String::new(), level)),
                    // A bare target shows everything of it.
                    None => Some((directive.to_string(), Level::Trace)),
                },
            };
            if let Some((target, level)) = rule {
                rules.retain(|(t, _)| *t != target);
                rules.push((target, level));
            }
        }
        Self(rules)
    }

    /// Whether a line of `target` at `level` is shown.
    pub(crate) fn shows(&self, target: &str, level: Level) -> bool {
        let decides = self
            .0
            .iter()
            .filter(|(prefix, _)| target.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len());
        decides.is_some_and(|(_, most)| level != Level::Off && level <= *most)
    }
}

/// The service's log: where lines go and which.
#[derive(Debug, Clone)]
pub(crate) struct Log {
    json: bool,
    filter: Filter,
}

impl Log {
    /// The log `format` (`text` or `json`) asks for, filtered by
    /// `ICESTAGE_LOG` or `RUST_LOG`.
    pub(crate) fn new(json: bool) -> Self {
        let directives = std::env::var("ICESTAGE_LOG")
            .or_else(|_| std::env::var("RUST_LOG"))
            .unwrap_or_default();
        Self {
            json,
            filter: Filter::parse(&directives),
        }
    }

    pub(crate) fn shows(&self, target: &str, level: Level) -> bool {
        self.filter.shows(target, level)
    }

    /// Writes one line of `target` at `level` with `fields`, if shown.
    pub(crate) fn line(&self, target: &str, level: Level, fields: Map<String, Value>) {
        if !self.shows(target, level) {
            return;
        }
        eprintln!("{}", self.format(target, level, fields));
    }

    fn format(&self, target: &str, level: Level, fields: Map<String, Value>) -> String {
        let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        if self.json {
            let mut line = Map::new();
            line.insert("time".into(), json!(time));
            line.insert("level".into(), json!(level.name()));
            line.insert("target".into(), json!(target));
            line.extend(fields);
            return Value::Object(line).to_string();
        }
        let mut line = format!("{time} {} {target}", level.name());
        for (key, value) in fields {
            match value {
                Value::String(text) if !text.contains([' ', '"', '=']) && !text.is_empty() => {
                    line.push_str(&format!(" {key}={text}"))
                }
                other => line.push_str(&format!(" {key}={other}")),
            }
        }
        line
    }
}

/// The log of this process, once `serve` set it up: state changes the
/// library reports go there (the shell and embedders set none, and print
/// nothing extra).
static SERVICE_LOG: OnceLock<Log> = OnceLock::new();

/// Makes `log` the process's service log (the first call wins).
pub(crate) fn install(log: Log) {
    let _ = SERVICE_LOG.set(log);
    crate::metrics::on_transition(transition);
}

/// One state change of an upload or download, as the library reports it.
fn transition(kind: &str, id: &str, state: &str) {
    if let Some(log) = SERVICE_LOG.get() {
        let mut fields = Map::new();
        fields.insert(format!("{kind}_id"), json!(id));
        fields.insert("state".into(), json!(state));
        log.line("icestage::state", Level::Info, fields);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_reads_rust_log_directives() {
        let filter = Filter::parse("warn,icestage::request=info,icestage::state=off, bad=noise");
        assert!(filter.shows("icestage::request", Level::Info));
        assert!(!filter.shows("icestage::request", Level::Debug));
        assert!(!filter.shows("icestage::state", Level::Error));
        assert!(!filter.shows("other", Level::Info));
        assert!(filter.shows("other", Level::Warn));
        let default = Filter::parse("");
        assert!(default.shows("icestage::request", Level::Info));
        assert!(!default.shows("icestage::request", Level::Debug));
    }

    #[test]
    fn a_line_is_text_or_one_json_object() {
        let mut fields = Map::new();
        fields.insert("route".into(), json!("/uploads/{id}"));
        fields.insert("status".into(), json!(200));
        fields.insert("caller".into(), json!("name with spaces"));
        let text = Log {
            json: false,
            filter: Filter::parse(""),
        }
        .format("icestage::request", Level::Info, fields.clone());
        for part in [
            " INFO icestage::request ",
            " route=/uploads/{id}",
            " status=200",
            " caller=\"name with spaces\"",
        ] {
            assert!(text.contains(part), "{part} in {text}");
        }
        let json: Value = serde_json::from_str(
            &Log {
                json: true,
                filter: Filter::parse(""),
            }
            .format("icestage::request", Level::Info, fields),
        )
        .unwrap();
        assert_eq!(
            (&json["level"], &json["route"], &json["status"]),
            (&json!("INFO"), &json!("/uploads/{id}"), &json!(200))
        );
    }
}
