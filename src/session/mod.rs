//! Sessions, the part uploads and downloads share: ids, the records the
//! status functions answer and the session logs keep, the table
//! properties both kinds of session table carry, and the context every
//! operation runs in.

pub(crate) mod expire;
pub(crate) mod log;
pub(crate) mod operation;
pub(crate) mod token;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use datafusion::execution::TaskContext;
use datafusion::execution::context::SessionState;
use datafusion::physical_plan::ExecutionPlan;

use crate::catalog::Catalogs;
use crate::config::IcestageOptions;
use crate::error::Result;

/// Staging table property: the session state.
pub const PROP_STATE: &str = "icestage.state";
/// Staging table property: creation time, RFC 3339.
pub const PROP_CREATED_AT: &str = "icestage.created-at";
/// Staging table property: expiry time, RFC 3339.
pub const PROP_EXPIRES_AT: &str = "icestage.expires-at";
/// Staging table property: why the last promotion failed.
pub const PROP_MESSAGE: &str = "icestage.message";
/// Table property (staging and download tables): who the session belongs to.
pub const PROP_OWNER: &str = "icestage.owner";
/// A fresh session id: 128 random bits as 32 lowercase hex characters.
pub(crate) fn random_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// `text` (trimmed, lowercased) if it has the shape of a session id.
pub(crate) fn id_shape(text: &str) -> Option<String> {
    let text = text.trim();
    (text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| text.to_ascii_lowercase())
}

/// An RFC 3339 time a session table keeps in property `key`.
pub(crate) fn property_time(props: &HashMap<String, String>, key: &str) -> Option<DateTime<Utc>> {
    props
        .get(key)
        .and_then(|v| DateTime::parse_from_rfc3339(v).ok())
        .map(|t| t.with_timezone(&Utc))
}

/// The state named `text` among `all`, as their `Display` names them.
pub(crate) fn state_named<S: Copy + fmt::Display>(all: &[S], text: &str) -> Option<S> {
    all.iter().copied().find(|s| s.to_string() == text)
}

/// What is known of one session (an upload, or a download): a row of the
/// status functions, and what the session log stores when a session ends.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SessionRecord<S> {
    pub(crate) id: String,
    pub(crate) state: S,
    pub(crate) catalog: String,
    pub(crate) target: String,
    pub(crate) staging: String,
    pub(crate) created_at: Option<DateTime<Utc>>,
    pub(crate) expires_at: Option<DateTime<Utc>>,
    /// When the log recorded it (`None` for a live session).
    pub(crate) recorded_at: Option<DateTime<Utc>>,
    pub(crate) rows: Option<i64>,
    pub(crate) files: Option<i64>,
    pub(crate) snapshot_id: Option<i64>,
    pub(crate) findings: Option<i64>,
    pub(crate) message: Option<String>,
    pub(crate) owner: Option<String>,
}

/// A named point in a promotion where a test can stop the process:
/// with `ICESTAGE_FAILPOINT=<name>` set, reaching it prints
/// `failpoint <name> reached` on stderr and blocks until the process is
/// killed, or, with `ICESTAGE_FAILPOINT_RESUME=<file>` set too, until that
/// file exists (a test acts in between). Compiled into debug builds only
/// (the test profile).
pub(crate) fn failpoint(name: &str) {
    if let Some(pause) = failpoint_held(name) {
        while !failpoint_resumed() {
            std::thread::sleep(pause);
        }
    }
}

/// [`failpoint`] for a task that must not hold its thread while it
/// waits: a background task, whose thread the service's requests need.
pub(crate) async fn failpoint_async(name: &str) {
    if let Some(pause) = failpoint_held(name) {
        while !failpoint_resumed() {
            tokio::time::sleep(pause).await;
        }
    }
}

/// How long a process a test holds at failpoint `name` waits between two
/// looks at [`failpoint_resumed`] (it says so on stderr); `None` when no
/// test holds it there.
fn failpoint_held(name: &str) -> Option<std::time::Duration> {
    #[cfg(debug_assertions)]
    if std::env::var("ICESTAGE_FAILPOINT").is_ok_and(|v| v == name) {
        eprintln!("failpoint {name} reached");
        let resumable = std::env::var_os("ICESTAGE_FAILPOINT_RESUME").is_some();
        return Some(std::time::Duration::from_millis(if resumable {
            100
        } else {
            3_600_000
        }));
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
    None
}

/// Whether the test let a held process go on: the file that
/// `ICESTAGE_FAILPOINT_RESUME` names exists.
fn failpoint_resumed() -> bool {
    std::env::var_os("ICESTAGE_FAILPOINT_RESUME").is_some_and(|f| std::path::Path::new(&f).exists())
}

/// [`failpoint`], where a test can also make the step fail: with
/// `ICESTAGE_FAILPOINT_ERROR=<name>` set, the first time this process
/// reaches it answers a storage error, which a caller retries as it would
/// a catalog or storage that did not answer. Debug builds only.
pub(crate) fn failpoint_or_error(name: &str) -> Result<()> {
    failpoint(name);
    #[cfg(debug_assertions)]
    {
        use std::sync::atomic::{AtomicBool, Ordering};
        static FAILED: AtomicBool = AtomicBool::new(false);
        if std::env::var("ICESTAGE_FAILPOINT_ERROR").is_ok_and(|v| v == name)
            && !FAILED.swap(true, Ordering::SeqCst)
        {
            return Err(crate::error::Error::Io(std::io::Error::other(format!(
                "failpoint {name}: an injected storage failure"
            ))));
        }
    }
    Ok(())
}

pub(crate) use crate::catalog::is_missing;

/// What a command needs while it runs.
pub(crate) struct CommandContext {
    pub(crate) icestage: Arc<Catalogs>,
    pub(crate) options: IcestageOptions,
    pub(crate) task: Arc<TaskContext>,
    /// The session that planned the command, for commands that write through
    /// DataFusion (`CREATE TABLE ... AS SELECT`).
    pub(crate) session: Option<Arc<SessionState>>,
    /// The physical plan of the command's input, if it has one.
    pub(crate) input: Option<Arc<dyn ExecutionPlan>>,
}

impl CommandContext {
    /// Where long commands report progress.
    pub(crate) fn progress(&self) -> Arc<dyn crate::progress::Progress> {
        match self
            .task
            .session_config()
            .get_extension::<crate::progress::ProgressSink>()
        {
            Some(sink) => Arc::clone(&sink.0),
            None => Arc::new(crate::progress::NoProgress),
        }
    }

    pub(crate) fn new(task: Arc<TaskContext>) -> Result<Self> {
        let config = task.session_config();
        Ok(Self {
            icestage: Catalogs::from_config(config)?,
            options: config
                .options()
                .extensions
                .get::<IcestageOptions>()
                .cloned()
                .unwrap_or_default(),
            task,
            session: None,
            input: None,
        })
    }
}
