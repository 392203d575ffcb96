//! The processes of a Ballista cluster (feature `cluster`), knowing every
//! job icestage sends: a scheduler, executors, and an in-process cluster.
//! The binary's `icestage scheduler` and `icestage executor` call these;
//! an application that hosts its own cluster processes calls them too, so
//! its processes decode what icestage's clients send.

use std::net::SocketAddr;

use crate::cluster::Jobs;
pub use crate::cluster::{
    ClusterSecret, ClusterTls, ExecutorOptions, SECRET_FILE_VARIABLE, TLS_FILE_VARIABLES,
};
use crate::error::Result;

/// Every job icestage's operations send to a cluster.
pub fn jobs() -> Jobs {
    let jobs = crate::upload::validation::distribute::jobs(Jobs::default());
    crate::ingest::distribute::jobs(jobs)
}

/// Runs a scheduler on `bind` until the process ends; it refuses every
/// caller (executor or client) without `secret`.
pub async fn run_scheduler(bind: SocketAddr, secret: ClusterSecret) -> Result<()> {
    crate::cluster::run_scheduler(bind, jobs(), secret).await
}

/// Runs an executor until the process ends (or the scheduler stops it).
pub async fn run_executor(options: ExecutorOptions) -> Result<()> {
    crate::cluster::run_executor(options, jobs()).await
}

/// Starts a scheduler and `executors` executors of `slots` task slots each
/// inside this process (each with its own sessions, codecs and runtime, as
/// separate processes would have); returns the URL, `df://127.0.0.1:PORT`.
/// Its ports want a secret only this process knows; sessions of this
/// process that name the URL carry it.
pub async fn start_in_process(executors: usize, slots: usize) -> Result<String> {
    crate::cluster::start_in_process(executors, slots, jobs()).await
}
