//! The cluster's processes, started from the icestage binary so that every
//! process knows icestage's codecs: a scheduler, executors, and an
//! in-process cluster for one machine and for tests.
//!
//! Tasks are pulled: an executor asks the scheduler for work when it has a
//! free slot, so it needs only its Arrow Flight port (where the next stage
//! fetches its shuffle output).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ballista_core::ConfigProducer;
use ballista_core::config::TaskSchedulingPolicy;
use ballista_core::extension::SessionConfigExt;
use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::serde::BallistaCodec;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::start_server;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionState;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::SessionConfig;

use super::codec::{IcestageLogicalCodec, IcestagePhysicalCodec};
use super::job::Jobs;
use super::write::ClusterQueryPlanner;
use crate::error::{Error, Result};

/// The session configuration every cluster process starts from: Ballista's,
/// with icestage's codecs, decoding `jobs`.
pub(crate) fn session_config(jobs: &Jobs) -> SessionConfig {
    SessionConfig::new_with_ballista()
        .with_ballista_logical_extension_codec(Arc::new(IcestageLogicalCodec::new(jobs.clone())))
        .with_ballista_physical_extension_codec(Arc::new(IcestagePhysicalCodec::new(jobs.clone())))
}

/// The scheduler's sessions: Ballista's own, with a planner that also
/// knows icestage's write.
fn session_builder(config: SessionConfig) -> datafusion::common::Result<SessionState> {
    let state = ballista_core::utils::default_session_builder(config)?;
    Ok(SessionStateBuilder::new_from_existing(state)
        .with_query_planner(Arc::new(ClusterQueryPlanner))
        .build())
}

fn config_producer(jobs: &Jobs) -> ConfigProducer {
    let jobs = jobs.clone();
    Arc::new(move || session_config(&jobs))
}

fn codec(jobs: &Jobs) -> BallistaCodec {
    BallistaCodec::new(
        Arc::new(IcestageLogicalCodec::new(jobs.clone())),
        Arc::new(IcestagePhysicalCodec::new(jobs.clone())),
    )
}

fn cluster_error(what: &str, error: impl std::fmt::Display) -> Error {
    Error::Config(format!("{what}: {error}"))
}

/// Runs a scheduler on `bind`, decoding `jobs`, until the process ends.
pub async fn run_scheduler(bind: SocketAddr, jobs: Jobs) -> Result<()> {
    let mut config = SchedulerConfig::default()
        .with_hostname(bind.ip().to_string())
        .with_port(bind.port())
        .with_scheduler_policy(TaskSchedulingPolicy::PullStaged)
        .with_override_config_producer(config_producer(&jobs))
        .with_override_session_builder(Arc::new(session_builder));
    config.bind_host = bind.ip().to_string();
    config.override_logical_codec = Some(Arc::new(IcestageLogicalCodec::new(jobs.clone())));
    config.override_physical_codec = Some(Arc::new(IcestagePhysicalCodec::new(jobs)));
    // A lost executor's tasks go to another after this long without a heartbeat.
    config.executor_timeout_seconds = 30;
    let cluster = BallistaCluster::new_from_config(&config)
        .await
        .map_err(|e| cluster_error("cannot start the scheduler", e))?;
    start_server(cluster, bind, Arc::new(config))
        .await
        .map_err(|e| cluster_error(&format!("the scheduler on {bind} stopped"), e))
}

/// What an executor needs to know.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// The scheduler's `host:port`.
    pub scheduler: String,
    /// Where this executor listens for shuffle reads (Arrow Flight).
    pub bind: SocketAddr,
    /// Where it keeps shuffle files; a fresh temporary folder when `None`.
    pub work_dir: Option<String>,
    /// Tasks it runs at once; the machine's cores when 0.
    pub concurrent_tasks: usize,
}

/// Runs an executor, decoding `jobs`, until the process ends (or the
/// scheduler stops it).
pub async fn run_executor(options: ExecutorOptions, jobs: Jobs) -> Result<()> {
    let (host, port) = options.scheduler.rsplit_once(':').ok_or_else(|| {
        Error::invalid(format!(
            "executor: scheduler '{}' is not HOST:PORT, e.g. 127.0.0.1:50050",
            options.scheduler
        ))
    })?;
    let scheduler_port = port.parse().map_err(|_| {
        Error::invalid(format!(
            "executor: scheduler port '{port}' is not a number: use HOST:PORT, e.g. 127.0.0.1:50050"
        ))
    })?;
    let config = ExecutorProcessConfig {
        bind_host: options.bind.ip().to_string(),
        external_host: Some(options.bind.ip().to_string()),
        port: options.bind.port(),
        scheduler_host: host.to_string(),
        scheduler_port,
        scheduler_connect_timeout_seconds: 30,
        concurrent_tasks: options.concurrent_tasks,
        task_scheduling_policy: TaskSchedulingPolicy::PullStaged,
        work_dir: options.work_dir,
        override_config_producer: Some(config_producer(&jobs)),
        override_logical_codec: Some(Arc::new(IcestageLogicalCodec::new(jobs.clone()))),
        override_physical_codec: Some(Arc::new(IcestagePhysicalCodec::new(jobs))),
        ..Default::default()
    };
    start_executor_process(Arc::new(config))
        .await
        .map_err(|e| cluster_error("the executor stopped", e))
}

/// Starts a scheduler and `executors` executors inside this process (each
/// with its own sessions, codecs and runtime, as separate processes would
/// have), decoding `jobs`, and returns the cluster's URL, `df://localhost:PORT`.
pub async fn start_in_process(
    executors: usize,
    concurrent_tasks: usize,
    jobs: Jobs,
) -> Result<String> {
    let address = ballista_scheduler::standalone::new_standalone_scheduler_with_builder(
        Arc::new(session_builder),
        config_producer(&jobs),
        codec(&jobs),
    )
    .await
    .map_err(|e| cluster_error("cannot start the in-process scheduler", e))?;
    let url = format!("http://localhost:{}", address.port());
    let mut attempts = 0;
    let client = loop {
        match SchedulerGrpcClient::connect(url.clone()).await {
            Ok(client) => break client,
            Err(e) if attempts >= 50 => {
                return Err(cluster_error("cannot reach the in-process scheduler", e));
            }
            Err(_) => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    for _ in 0..executors.max(1) {
        ballista_executor::new_standalone_executor_from_builder(
            client.clone(),
            concurrent_tasks.max(1),
            config_producer(&jobs),
            Arc::new(|_| Ok(Arc::new(RuntimeEnvBuilder::new().build()?))),
            codec(&jobs),
            BallistaFunctionRegistry::default(),
        )
        .await
        .map_err(|e| cluster_error("cannot start an in-process executor", e))?;
    }
    Ok(format!("df://localhost:{}", address.port()))
}
