//! One run of a pipe: take the lease, find the files (a listing, or the
//! queue's notifications and a listing now and then), load what is new with
//! `COPY INTO`'s exactly-once path, record the outcome, give the lease back.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::notify::Notifications;
use super::{Failure, MAX_REMEMBERED_FAILURES, Pipe, PipeName, RunRow, list, load, short_error};
use crate::catalog::bridge::insert::append_stored;
use crate::catalog::commit::{Swap, swap_properties};
use crate::catalog::{Catalogs, IcebergCatalog};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::ingest::copy_into::{CopyRun, Loaded, copy_files, loaded_files};
use crate::ingest::source::{Access, SourceFile, candidates, files_at};
use crate::progress::NoProgress;
use crate::rows::result_row;
use crate::session::CommandContext;
use crate::session::is_missing;
use crate::session::operation::Operation;

result_row! {
    /// What one run of a pipe did: the row of `RUN PIPE`.
    #[derive(Debug, Clone, PartialEq)]
    pub struct PipeRun {
        /// The pipe.
        pub pipe: super::PipeName,
        /// Files loaded by this run.
        pub files_loaded: i64,
        /// Files found that were loaded before.
        pub files_skipped: i64,
        /// Files that failed in this run (reported in `pipe_status`).
        pub files_failed: i64,
        /// Rows loaded.
        pub rows: i64,
        /// The target's snapshot holding them (none when nothing was new).
        pub snapshot_id: Option<i64>,
        /// What happened, in words.
        pub message: String,
        /// The process that ran it.
        pub runner: String,
    }
}

/// This process, as pipes name their runner: host, process id and a
/// random tag (a restarted process is another runner).
pub(crate) fn runner_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".to_string());
        format!(
            "{host}:{}:{:08x}",
            std::process::id(),
            rand::random::<u32>()
        )
    })
}

/// `RUN PIPE <name>`.
#[derive(Debug)]
pub(crate) struct RunPipe {
    pub(crate) name: PipeName,
}

impl Operation for RunPipe {
    const NAME: &'static str = "RunPipe";
    type Outcome = PipeRun;

    /// On the session's cluster, if it names one.
    async fn run(&self, ctx: &CommandContext) -> Result<PipeRun> {
        let cluster = crate::cluster::of_options(&ctx.options)?;
        run_pipe(&ctx.icestage, &self.name, cluster.as_ref()).await
    }
}

impl fmt::Display for RunPipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name)
    }
}

/// `RUN PIPE <name>`: loads what is new now, whether the pipe is running or
/// paused; refused while another runner holds it. With a `cluster`, its
/// executors read and write the files.
async fn run_pipe(
    icestage: &Catalogs,
    name: &PipeName,
    cluster: Option<&Cluster>,
) -> Result<PipeRun> {
    let pipe = load(icestage, name).await?;
    run(icestage, pipe, true, cluster)
        .await?
        .ok_or_else(|| Error::internal(format!("pipe {name} was not run")))
}

/// The runs of the running pipes whose interval has passed, each loaded by
/// this process if no other runner holds it: what `icestage serve` calls
/// every second. One pipe's failure does not keep the others from running.
pub(crate) async fn run_due(
    icestage: &Catalogs,
    cluster: Option<&Cluster>,
) -> Result<Vec<(PipeName, Result<PipeRun>)>> {
    let now = Utc::now();
    let mut runs = vec![];
    for pipe in list(icestage).await? {
        if !pipe.due(now) {
            continue;
        }
        let name = pipe.name.clone();
        match run(icestage, pipe, false, cluster).await {
            Ok(Some(done)) => runs.push((name, Ok(done))),
            Ok(None) => {}
            Err(e) => runs.push((name, Err(e))),
        }
    }
    Ok(runs)
}

fn time(at: DateTime<Utc>) -> String {
    at.to_rfc3339()
}

/// Keeps the lease of `holder` alive until dropped.
struct Heartbeat(tokio::task::JoinHandle<()>);

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn heartbeat(
    catalog: Arc<IcebergCatalog>,
    pipe: &Pipe,
    holder: &str,
    lease: Duration,
) -> Heartbeat {
    let table = pipe.table.clone();
    let holder = holder.to_string();
    Heartbeat(tokio::spawn(async move {
        loop {
            tokio::time::sleep(lease / 3).await;
            let until = Utc::now() + lease;
            let renewed = swap_if_held(
                &catalog,
                &table,
                &holder,
                HashMap::from([(super::PROP_UNTIL.to_string(), time(until))]),
            )
            .await;
            // Lost or failing: the run goes on; its commit is safe anyway
            // (see the module documentation of `pipe`).
            if !matches!(renewed, Ok(Some(_))) {
                return;
            }
        }
    }))
}

async fn run(
    icestage: &Catalogs,
    pipe: Pipe,
    manual: bool,
    cluster: Option<&Cluster>,
) -> Result<Option<PipeRun>> {
    let catalog = Arc::clone(icestage.catalog(&pipe.catalog)?);
    // The lease names this run: a second run in this process waits its turn
    // like any other runner's.
    let me = format!(
        "{}/{}",
        runner_id(),
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let me = me.as_str();
    let started = Utc::now();
    let (lease, interval) = (pipe.options.lease, pipe.options.interval);
    let accept = {
        let me = me.to_string();
        move |props: &HashMap<String, String>| {
            let now = Utc::now();
            let free = props
                .get(super::PROP_HOLDER)
                .is_none_or(|h| h.is_empty() || *h == me)
                || crate::session::property_time(props, super::PROP_UNTIL)
                    .is_none_or(|until| until <= now);
            // A scheduled run is due only once the interval passed since the
            // last run of any runner.
            let due = manual
                || crate::session::property_time(props, super::PROP_LAST_RUN).is_none_or(|at| {
                    now.signed_duration_since(at).to_std().unwrap_or_default() >= interval
                });
            free && due
        }
    };
    let taken = swap_properties(
        &catalog,
        &pipe.table,
        super::PROP_HOLDER,
        accept,
        HashMap::from([
            (super::PROP_HOLDER.to_string(), me.to_string()),
            (super::PROP_UNTIL.to_string(), time(started + lease)),
            (super::PROP_LAST_RUN.to_string(), time(started)),
        ]),
    )
    .await?;
    let pipe = match taken {
        Swap::Done(table) => Pipe::from_table(&pipe.name, &pipe.catalog, table)?,
        Swap::Refused(holder) if manual => {
            return Err(Error::Conflict(format!(
                "pipe {} is being loaded by runner {holder} now: wait for its run to end (see \
                 pipe_status('{}')), then RUN PIPE again",
                pipe.name, pipe.name
            )));
        }
        Swap::Refused(_) => return Ok(None),
    };
    let beat = heartbeat(Arc::clone(&catalog), &pipe, me, lease);
    let outcome = load_new(&catalog, &pipe, started, cluster).await;
    std::mem::drop(beat);
    let finished = Utc::now();

    let mut failures = pipe.failures.clone();
    let mut properties = HashMap::new();
    let (run, message) = match &outcome {
        Ok(found) => {
            let run = &found.run;
            let loaded: HashSet<&str> = run.loaded.iter().map(|f| f.uri.as_str()).collect();
            let failed: HashSet<&str> = run.failed.iter().map(|f| f.uri.as_str()).collect();
            failures
                .retain(|f| !loaded.contains(f.uri.as_str()) && !failed.contains(f.uri.as_str()));
            if let Some(listed) = &found.listed {
                let present: HashSet<&str> = listed.iter().map(|f| f.uri.as_str()).collect();
                failures.retain(|f| present.contains(f.uri.as_str()));
                properties.insert(super::PROP_LAST_LISTED.to_string(), time(started));
            }
            failures.extend(run.failed.iter().map(|f| Failure {
                uri: f.uri.clone(),
                size: f.loaded.size,
                etag: f.loaded.etag.clone(),
                error: short_error(&f.error),
                at: finished,
            }));
            failures.truncate(MAX_REMEMBERED_FAILURES);
            properties.insert(super::PROP_LAST_ERROR.to_string(), String::new());
            if run.report.files_loaded > 0 {
                properties.insert(super::PROP_LAST_LOADED.to_string(), time(finished));
            }
            properties.insert(
                super::PROP_FILES.to_string(),
                (pipe.files_loaded + run.report.files_loaded).to_string(),
            );
            properties.insert(
                super::PROP_ROWS.to_string(),
                (pipe.rows_loaded + run.report.rows).to_string(),
            );
            (Some(run), run.report.message.clone())
        }
        Err(e) => {
            let text = short_error(&e.user_message());
            properties.insert(super::PROP_LAST_ERROR.to_string(), text.clone());
            (None, format!("the run failed: {text}"))
        }
    };
    properties.insert(
        super::PROP_FAILURES.to_string(),
        serde_json::to_string(&failures).expect("failures serialize"),
    );
    let result = PipeRun {
        pipe: pipe.name.clone(),
        files_loaded: run.map_or(0, |r| r.report.files_loaded),
        files_skipped: run.map_or(0, |r| r.report.files_skipped),
        files_failed: run.map_or(0, |r| r.report.files_failed),
        rows: run.map_or(0, |r| r.report.rows),
        snapshot_id: run.and_then(|r| r.report.snapshot_id),
        message,
        runner: runner_id().to_string(),
    };
    if result.files_loaded > 0 || result.files_failed > 0 || outcome.is_err() {
        record_run(&catalog, &pipe, started, finished, &result).await?;
    }
    let mut released = properties.clone();
    released.insert(super::PROP_HOLDER.to_string(), String::new());
    released.insert(super::PROP_UNTIL.to_string(), String::new());
    if swap_if_held(&catalog, &pipe.table, me, released)
        .await?
        .is_none()
    {
        // The lease ran out and another runner took the pipe: record what
        // this run did all the same, leaving the lease alone.
        swap_properties(
            &catalog,
            &pipe.table,
            super::PROP_HOLDER,
            |_| true,
            properties,
        )
        .await?;
    }
    match outcome {
        Ok(found) => {
            // The files are loaded (or recorded as failed): their
            // notifications are done with. Deleted only now, so a runner
            // that dies before this point sees them again.
            if let Some(notifications) = found.notifications {
                notifications.delete().await?;
            }
            Ok(Some(result))
        }
        // A scheduled run that fails as the last one did stays quiet (it is
        // in pipe_status); a new error is the caller's to report.
        Err(e)
            if !manual
                && pipe.last_error.as_deref() == Some(short_error(&e.user_message()).as_str()) =>
        {
            Ok(Some(result))
        }
        Err(e) => Err(e),
    }
}

/// Appends a row for this run to the pipe's table (what the webhooks read).
async fn record_run(
    catalog: &IcebergCatalog,
    pipe: &Pipe,
    started: DateTime<Utc>,
    finished: DateTime<Utc>,
    run: &PipeRun,
) -> Result<()> {
    let row = RunRow {
        run_id: uuid::Uuid::new_v4().to_string(),
        started_at: started,
        finished_at: finished,
        runner: run.runner.clone(),
        files_loaded: run.files_loaded,
        rows: run.rows,
        files_failed: run.files_failed,
        snapshot_id: run.snapshot_id,
        message: run.message.clone(),
    };
    append_stored(catalog, &pipe.table, &[row]).await
}

/// What one run found and did.
struct Found {
    run: CopyRun,
    /// Every file under the prefix, when this run listed it.
    listed: Option<Vec<SourceFile>>,
    /// The notifications this run read.
    notifications: Option<Notifications>,
}

async fn load_new(
    catalog: &IcebergCatalog,
    pipe: &Pipe,
    started: DateTime<Utc>,
    cluster: Option<&Cluster>,
) -> Result<Found> {
    let options = pipe.source_options()?;
    let format = options.format.ok_or_else(|| {
        Error::invalid(format!(
            "pipe {} has no format: DROP PIPE {} and create it again with COPY INTO ... WITH (format = '...')",
            pipe.name, pipe.name
        ))
    })?;
    let access = Access::open(&pipe.uri, &options).await?;
    let mut files = vec![];
    let mut notifications = None;
    if let Some(queue) = &pipe.options.notification_queue {
        let received = Notifications::receive(&access, queue, &options).await?;
        files = files_at(&access, &received.keys).await?;
        notifications = Some(received);
    }
    let list_now = pipe.options.notification_queue.is_none()
        || pipe.last_listed.is_none_or(|at| {
            started
                .signed_duration_since(at)
                .to_std()
                .unwrap_or_default()
                >= pipe.options.list_interval
        });
    let listed = if list_now {
        let all = candidates(&access).await?;
        files = all.clone();
        Some(all)
    } else {
        None
    };
    files.retain(|f| access.admits(&options, &f.meta.location));
    let run = copy_files(
        catalog,
        &pipe.target,
        &access,
        files,
        format,
        &options,
        &pipe.failed_before(),
        Arc::new(NoProgress),
        cluster,
    )
    .await?;
    record(&pipe.name.to_string(), &run, started);
    Ok(Found {
        run,
        listed,
        notifications,
    })
}

/// The metrics of one run of pipe `name`: files loaded and failed, and its
/// lag, the age of the oldest file it loaded when the run started (0 when
/// it found nothing new: it had caught up).
fn record(name: &str, run: &crate::ingest::copy_into::CopyRun, started: DateTime<Utc>) {
    const FILES: &str = "icestage_pipe_files_total";
    const FILES_HELP: &str = "Files pipes loaded or failed to load, by pipe and outcome.";
    let labels = |outcome| [("pipe", name), ("outcome", outcome)];
    crate::metrics::count(
        FILES,
        FILES_HELP,
        &labels("loaded"),
        run.loaded.len() as f64,
    );
    crate::metrics::count(
        FILES,
        FILES_HELP,
        &labels("failed"),
        run.failed.len() as f64,
    );
    let lag = run
        .loaded
        .iter()
        .map(|f| f.meta.last_modified)
        .min()
        .map_or(0, |oldest| {
            started.signed_duration_since(oldest).num_seconds().max(0)
        });
    crate::metrics::set(
        "icestage_pipe_lag_seconds",
        "Age of the oldest file a pipe's last run loaded, when the run started (0: nothing was waiting).",
        &[("pipe", name)],
        lag as f64,
    );
}

/// The files under a pipe's prefix not loaded yet (failed ones left out).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending {
    /// How many.
    pub(crate) files: i64,
    /// The age in seconds of the oldest, when there is one.
    pub(crate) lag_seconds: Option<i64>,
}

/// What waits under `pipe`'s prefix, listed now.
pub(crate) async fn pending(icestage: &Catalogs, pipe: &Pipe) -> Result<Pending> {
    let options = pipe.source_options()?;
    let access = Access::open(&pipe.uri, &options).await?;
    let files = candidates(&access).await?;
    let catalog = icestage.catalog(&pipe.catalog)?;
    let loaded: HashMap<String, Loaded> = match catalog.catalog().load_table(&pipe.target).await {
        Ok(target) => loaded_files(catalog, &target).await?.files,
        Err(e) if is_missing(&e) => HashMap::new(),
        Err(e) => return Err(e.into()),
    };
    let failed = pipe.failed_before();
    let waiting: Vec<&SourceFile> = files
        .iter()
        .filter(|f| !loaded.contains_key(&f.uri) && failed.get(&f.uri) != Some(&Loaded::of(f)))
        .collect();
    let oldest = waiting.iter().map(|f| f.meta.last_modified).min();
    let lag = oldest.map(|at| Utc::now().signed_duration_since(at).num_seconds().max(0));
    Ok(Pending {
        files: waiting.len() as i64,
        lag_seconds: lag,
    })
}

/// Sets `properties` on the pipe if it is still held by `holder`.
async fn swap_if_held(
    catalog: &IcebergCatalog,
    table: &iceberg::table::Table,
    holder: &str,
    properties: HashMap<String, String>,
) -> Result<Option<iceberg::table::Table>> {
    let holder = holder.to_string();
    match swap_properties(
        catalog,
        table,
        super::PROP_HOLDER,
        move |props| props.get(super::PROP_HOLDER) == Some(&holder),
        properties,
    )
    .await?
    {
        Swap::Done(table) => Ok(Some(table)),
        Swap::Refused(_) => Ok(None),
    }
}
