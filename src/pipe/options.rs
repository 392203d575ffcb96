//! The options of `CREATE PIPE`: how it runs (`WITH (...)` before `AS`)
//! and which of `COPY INTO`'s options its runs take.

use std::time::Duration;

use crate::config::{OptionDoc, WithOptions, format_duration, parse_duration};
use crate::error::{Error, Result};
use crate::ingest::{OnError, SourceOptions};

/// How long a pipe's runs may be apart, at least and at most.
const INTERVAL_BOUNDS: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(24 * 3600));
/// How long a lease may be, at least and at most.
const LEASE_BOUNDS: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(3600));

/// How a pipe finds and loads files, beside its `COPY INTO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipeOptions {
    /// Time between runs (`interval`, default 30 s, 1 s to 24 h).
    pub interval: Duration,
    /// How long a runner holds the pipe without renewing (`lease`, default
    /// 2 min): a runner that dies is replaced after this.
    pub lease: Duration,
    /// An SQS queue receiving the bucket's S3 event notifications
    /// (`notification_queue`): new files are found from its messages.
    pub notification_queue: Option<String>,
    /// With a queue: time between full listings, which catch what a
    /// notification missed (`list_interval`, default 10 min).
    pub list_interval: Duration,
}

impl Default for PipeOptions {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(30),
            lease: Duration::from_secs(120),
            notification_queue: None,
            list_interval: Duration::from_secs(600),
        }
    }
}

fn bounded(name: &str, value: &str, (min, max): (Duration, Duration)) -> Result<Duration> {
    let duration = parse_duration(value)?;
    if duration < min || duration > max {
        return Err(Error::invalid(format!(
            "pipe option {name} = '{value}' is out of range: give {} to {}",
            format_duration(min),
            format_duration(max)
        )));
    }
    Ok(duration)
}

impl WithOptions for PipeOptions {
    const STATEMENT: &'static str = "CREATE PIPE";
    const OPTIONS: &'static [OptionDoc] = &[
        OptionDoc {
            key: "interval",
            default: "`'30s'`",
            doc: "time between runs (1 s to 24 h)",
        },
        OptionDoc {
            key: "lease",
            default: "`'2m'`",
            doc: "how long a runner holds the pipe without renewing; a runner that dies is replaced after it (2 s to 1 h)",
        },
        OptionDoc {
            key: "notification_queue",
            default: "none (new files are found by listing)",
            doc: "the URL of an SQS queue receiving the bucket's S3 event notifications",
        },
        OptionDoc {
            key: "list_interval",
            default: "`'10m'`",
            doc: "with a queue, time between full listings that catch what a notification missed (1 s to 24 h)",
        },
    ];

    fn parse(pairs: &[(String, String)]) -> Result<Self> {
        let mut options = Self::default();
        for (key, value) in pairs {
            match key.as_str() {
                "interval" => options.interval = bounded(key, value, INTERVAL_BOUNDS)?,
                "lease" => options.lease = bounded(key, value, LEASE_BOUNDS)?,
                "list_interval" => options.list_interval = bounded(key, value, INTERVAL_BOUNDS)?,
                _ => {
                    if !value.starts_with("https://") && !value.starts_with("http://") {
                        return Err(Error::invalid(format!(
                            "notification_queue = '{value}' is not a queue URL: give the SQS \
                             queue's URL, e.g. \
                             'https://sqs.eu-west-1.amazonaws.com/123456789012/landing-events'"
                        )));
                    }
                    options.notification_queue = Some(value.clone());
                }
            }
        }
        Ok(options)
    }
}

/// COPY INTO options a pipe refuses, and why.
fn refused_copy_option(key: &str) -> Option<&'static str> {
    match key {
        "access_key_id" | "secret_access_key" | "session_token" => Some(
            "a pipe's definition is kept in the catalog, where secrets do not belong: give the \
             runner credentials through its environment, or role_arn",
        ),
        "files" => {
            Some("a pipe watches the whole prefix: point the URI at a narrower prefix instead")
        }
        "all_files" => Some("a pipe always takes every file under its prefix"),
        "force" => {
            Some("a pipe loads each file once: run COPY INTO ... WITH (force = true) to reload")
        }
        "validation_mode" => Some(
            "a pipe loads what lands: check the files first with COPY INTO ... WITH \
             (validation_mode = 'return_errors')",
        ),
        _ => None,
    }
}

/// The options a pipe's runs give `COPY INTO`: those written, every file
/// of the prefix, a failed file skipped.
pub(super) fn copy_source_options(pairs: &[(String, String)]) -> Result<SourceOptions> {
    for (key, _) in pairs {
        if let Some(why) = refused_copy_option(key) {
            return Err(Error::invalid(format!(
                "CREATE PIPE takes no COPY INTO option '{key}': {why}"
            )));
        }
    }
    let mut options = SourceOptions::from_with(pairs)?;
    options.all_files = true;
    options.on_error = match options.on_error {
        OnError::Continue => OnError::Continue,
        OnError::SkipFile => OnError::SkipFile,
        OnError::AbortStatement if pairs.iter().any(|(k, _)| k == "on_error") => {
            return Err(Error::invalid(
                "CREATE PIPE takes on_error = 'skip_file' (the default: a file that fails is \
                 skipped and reported in pipe_status) or 'continue' (malformed rows are \
                 rejected one by one), not 'abort_statement': a pipe never stops on one file"
                    .to_string(),
            ));
        }
        OnError::AbortStatement => OnError::SkipFile,
    };
    Ok(options)
}
