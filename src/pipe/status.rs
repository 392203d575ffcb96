//! Where pipes stand: `pipes()` and `pipe_status('<name>')`, and the runs
//! they recorded (what the pipe webhooks report).

use std::fmt;

use chrono::{DateTime, Utc};

use super::{Pipe, PipeName, PipeState, RunRow, list, load, run};
use crate::catalog::Catalogs;
use crate::config::format_duration;
use crate::error::Result;
use crate::rows::{StoredRow, result_row};
use crate::session::CommandContext;
use crate::session::operation::Operation;

result_row! {
    /// Where a pipe stands: a row of `pipes()` and `pipe_status('<name>')`.
    #[derive(Debug, Clone, PartialEq)]
    pub struct PipeStatus {
        /// The pipe.
        pub pipe: PipeName,
        /// Its catalog.
        pub catalog: String,
        /// `running` (loaded at every interval) or `paused`.
        pub state: PipeState,
        /// The table it loads.
        pub target_table: String,
        /// The prefix it watches.
        pub source: String,
        /// Time between runs.
        pub interval: String,
        /// How it finds new files.
        pub discovery: String,
        /// When it last ran.
        pub last_run_at: Option<DateTime<Utc>>,
        /// When it last loaded a file.
        pub last_loaded_at: Option<DateTime<Utc>>,
        /// Files loaded since it was created.
        pub files_loaded: i64,
        /// Rows loaded since it was created.
        pub rows_loaded: i64,
        /// Files that failed and did not load since (each is tried again
        /// once it changes).
        pub files_failed: i64,
        /// The first failed files and their errors.
        pub failures: Option<String>,
        /// Why its last run failed, if it did.
        pub last_error: Option<String>,
        /// Files under the prefix not loaded yet (not counting failed
        /// ones), as listed now.
        pub pending_files: Option<i64>,
        /// Seconds since the oldest of them was written: how far the pipe is
        /// behind.
        pub lag_seconds: Option<i64>,
        /// The runner loading it now, if one is.
        pub running_on: Option<String>,
    }
}

/// How many failed files a status names.
const NAMED_FAILURES: usize = 3;

impl Pipe {
    fn status(&self, pending: Option<run::Pending>) -> PipeStatus {
        let failures = (!self.failures.is_empty()).then(|| {
            let mut named: Vec<String> = self
                .failures
                .iter()
                .take(NAMED_FAILURES)
                .map(|f| format!("{}: {}", f.uri, f.error))
                .collect();
            if self.failures.len() > NAMED_FAILURES {
                named.push(format!("and {} more", self.failures.len() - NAMED_FAILURES));
            }
            named.join("; ")
        });
        PipeStatus {
            pipe: self.name.clone(),
            catalog: self.catalog.clone(),
            state: self.state,
            target_table: self.target.to_string(),
            source: self.uri.clone(),
            interval: format_duration(self.options.interval),
            discovery: match &self.options.notification_queue {
                Some(queue) => format!(
                    "notifications from {queue}, and listing every {}",
                    format_duration(self.options.list_interval)
                ),
                None => "listing".to_string(),
            },
            last_run_at: self.last_run,
            last_loaded_at: self.last_loaded,
            files_loaded: self.files_loaded,
            rows_loaded: self.rows_loaded,
            files_failed: self.failures.len() as i64,
            failures,
            last_error: self.last_error.clone(),
            pending_files: pending.map(|p| p.files),
            lag_seconds: pending.and_then(|p| p.lag_seconds),
            running_on: self.held_by(Utc::now()).map(str::to_string),
        }
    }
}

/// `pipe_status('<name>')`, with the files pending as listed now.
/// `pipe_status('<name>')`.
#[derive(Debug)]
pub(crate) struct ShowPipe {
    pub(crate) name: PipeName,
}

impl Operation for ShowPipe {
    const NAME: &'static str = "PipeStatus";
    type Outcome = PipeStatus;

    async fn run(&self, ctx: &CommandContext) -> Result<PipeStatus> {
        status(&ctx.icestage, &self.name).await
    }
}

impl fmt::Display for ShowPipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name)
    }
}

/// `pipes()`.
#[derive(Debug)]
pub(crate) struct ListPipes;

impl Operation for ListPipes {
    const NAME: &'static str = "ListPipes";
    type Outcome = Vec<PipeStatus>;

    async fn run(&self, ctx: &CommandContext) -> Result<Vec<PipeStatus>> {
        statuses(&ctx.icestage).await
    }
}

impl fmt::Display for ListPipes {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        Ok(())
    }
}

pub(crate) async fn status(icestage: &Catalogs, name: &PipeName) -> Result<PipeStatus> {
    let pipe = load(icestage, name).await?;
    let pending = run::pending(icestage, &pipe).await.ok();
    Ok(pipe.status(pending))
}

/// `pipes()`: every pipe, with the files pending as listed now.
pub(crate) async fn statuses(icestage: &Catalogs) -> Result<Vec<PipeStatus>> {
    let mut rows = vec![];
    for pipe in list(icestage).await? {
        let pending = run::pending(icestage, &pipe).await.ok();
        rows.push(pipe.status(pending));
    }
    Ok(rows)
}

result_row! {
    /// One recorded run of a pipe (one that loaded or failed something):
    /// what the `pipe.loaded` and `pipe.failed` webhooks carry.
    #[derive(Debug, Clone, PartialEq)]
    pub struct PipeRunRecord {
        /// The pipe.
        pub pipe: PipeName,
        /// The run.
        pub run_id: String,
        /// When it started.
        pub started_at: Option<DateTime<Utc>>,
        /// When it ended.
        pub finished_at: Option<DateTime<Utc>>,
        /// The process that ran it.
        pub runner: String,
        /// Files it loaded.
        pub files_loaded: i64,
        /// Rows it loaded.
        pub rows: i64,
        /// Files that failed in it.
        pub files_failed: i64,
        /// The target's snapshot holding its rows.
        pub snapshot_id: Option<i64>,
        /// What happened, in words.
        pub message: String,
    }
}

/// The recorded runs of every pipe that ended at or after `since`.
pub(crate) async fn runs_since(
    icestage: &Catalogs,
    since: DateTime<Utc>,
) -> Result<Vec<PipeRunRecord>> {
    use crate::catalog::manifests::lookup::Wanted;
    let mut records = vec![];
    for pipe in list(icestage).await? {
        // The files whose runs may have finished since, from manifests
        // decoded once; the runs are kept below.
        let wanted = Wanted::since(pipe.table.metadata().current_schema(), "finished_at", since);
        let batches = icestage
            .catalog(&pipe.catalog)?
            .manifests()
            .read(&pipe.table, wanted)
            .await?;
        let table = pipe.table.identifier().to_string();
        for batch in &batches {
            for run in RunRow::from_batch(&table, batch)? {
                records.push(PipeRunRecord {
                    pipe: pipe.name.clone(),
                    run_id: run.run_id,
                    started_at: Some(run.started_at),
                    finished_at: Some(run.finished_at),
                    runner: run.runner,
                    files_loaded: run.files_loaded,
                    rows: run.rows,
                    files_failed: run.files_failed,
                    snapshot_id: run.snapshot_id,
                    message: run.message,
                });
            }
        }
    }
    records.retain(|run| run.finished_at.is_some_and(|at| at >= since));
    Ok(records)
}
