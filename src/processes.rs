//! The processes of a Ballista cluster (feature `cluster`), knowing every
//! job icestage sends: a scheduler, executors, and an in-process cluster.
//! The binary's `icestage scheduler` and `icestage executor` call these;
//! an application that hosts its own cluster processes calls them too, so
//! its processes decode what icestage's clients send.

use std::net::SocketAddr;

pub use crate::cluster::ExecutorOptions;
use crate::cluster::Jobs;
use crate::error::Result;

/// Every job icestage's operations send to a cluster.
pub fn jobs() -> Jobs {
    let jobs = crate::upload::distribute::jobs(Jobs::default());
    crate::ingest::distribute::jobs(jobs)
}

/// Runs a scheduler on `bind` until the process ends.
pub async fn run_scheduler(bind: SocketAddr) -> Result<()> {
    crate::cluster::run_scheduler(bind, jobs()).await
}

/// Runs an executor until the process ends (or the scheduler stops it).
pub async fn run_executor(options: ExecutorOptions) -> Result<()> {
    crate::cluster::run_executor(options, jobs()).await
}

/// Starts a scheduler and `executors` executors of `slots` task slots each
/// inside this process (each with its own sessions, codecs and runtime, as
/// separate processes would have); returns the URL, `df://localhost:PORT`.
pub async fn start_in_process(executors: usize, slots: usize) -> Result<String> {
    crate::cluster::start_in_process(executors, slots, jobs()).await
}
