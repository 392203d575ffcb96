//! The cluster's processes, started from the icestage binary so that every
//! process knows icestage's codecs: a scheduler, executors, and an
//! in-process cluster for one machine and for tests.
//!
//! Tasks are pulled: an executor asks the scheduler for work when it has a
//! free slot, so it needs only its Arrow Flight port (where the next stage
//! fetches its shuffle output). Every port refuses a caller without the
//! cluster's secret ([`ClusterSecret`]), and every connection these
//! processes open carries it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use ballista_core::ConfigProducer;
use ballista_core::config::TaskSchedulingPolicy;
use ballista_core::error::BallistaError;
use ballista_core::extension::SessionConfigExt;
use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::serde::BallistaCodec;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::protobuf::scheduler_grpc_server::SchedulerGrpcServer;
use ballista_core::serde::protobuf::{ExecutorRegistration, GetJobStatusParams};
use ballista_core::serde::scheduler::{
    ExecutorOperatingSystemSpecification, ExecutorSpecification,
};
use ballista_core::utils::{GrpcServerConfig, create_grpc_client_endpoint, create_grpc_server};
use ballista_executor::executor::Executor;
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use ballista_executor::flight_service::BallistaFlightService;
use ballista_executor::metrics::LoggingMetricsCollector;
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::create_scheduler;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionState;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::SessionConfig;
use datafusion_proto::protobuf::{LogicalPlanNode, PhysicalPlanNode};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::auth::ClusterSecret;
use super::codec::{IcestageLogicalCodec, IcestagePhysicalCodec};
use super::job::Jobs;
use super::write::ClusterQueryPlanner;
use crate::error::{Error, Result};

/// The largest gRPC message the processes send or take (Ballista's default).
const MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// How long a process waits for the scheduler to answer at start.
const CONNECT: Duration = Duration::from_secs(30);

/// The session configuration every cluster process and client starts from:
/// Ballista's, with icestage's codecs, decoding `jobs`, whose connections
/// carry `secret`.
pub(crate) fn session_config(jobs: &Jobs, secret: &ClusterSecret) -> SessionConfig {
    SessionConfig::new_with_ballista()
        .with_ballista_logical_extension_codec(Arc::new(IcestageLogicalCodec::new(jobs.clone())))
        .with_ballista_physical_extension_codec(Arc::new(IcestagePhysicalCodec::new(jobs.clone())))
        .with_ballista_override_create_grpc_client_endpoint(secret.endpoint_override())
}

/// The scheduler's sessions: Ballista's own, with a planner that also
/// knows icestage's write.
fn session_builder(config: SessionConfig) -> datafusion::common::Result<SessionState> {
    let state = ballista_core::utils::default_session_builder(config)?;
    Ok(SessionStateBuilder::new_from_existing(state)
        .with_query_planner(Arc::new(ClusterQueryPlanner))
        .build())
}

fn config_producer(jobs: &Jobs, secret: &ClusterSecret) -> ConfigProducer {
    let (jobs, secret) = (jobs.clone(), secret.clone());
    Arc::new(move || session_config(&jobs, &secret))
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

/// The scheduler's configuration on `bind`.
fn scheduler_config(bind: SocketAddr, jobs: &Jobs, secret: &ClusterSecret) -> SchedulerConfig {
    let mut config = SchedulerConfig::default()
        .with_hostname(bind.ip().to_string())
        .with_port(bind.port())
        .with_scheduler_policy(TaskSchedulingPolicy::PullStaged)
        .with_override_config_producer(config_producer(jobs, secret))
        .with_override_session_builder(Arc::new(session_builder))
        .with_override_create_grpc_client_endpoint(secret.endpoint_override());
    config.bind_host = bind.ip().to_string();
    config.override_logical_codec = Some(Arc::new(IcestageLogicalCodec::new(jobs.clone())));
    config.override_physical_codec = Some(Arc::new(IcestagePhysicalCodec::new(jobs.clone())));
    // A lost executor's tasks go to another after this long without a heartbeat.
    config.executor_timeout_seconds = 30;
    config
}

/// Serves a scheduler on `listener` until the process ends, refusing
/// callers without `secret`.
async fn serve_scheduler(
    listener: TcpListener,
    config: SchedulerConfig,
    secret: &ClusterSecret,
) -> Result<()> {
    let bind = listener
        .local_addr()
        .map_err(|e| cluster_error("the scheduler's address", e))?;
    let config = Arc::new(config);
    let cluster = BallistaCluster::new_from_config(&config)
        .await
        .map_err(|e| cluster_error("cannot start the scheduler", e))?;
    let scheduler = create_scheduler::<LogicalPlanNode, PhysicalPlanNode>(cluster, config)
        .await
        .map_err(|e| cluster_error("cannot start the scheduler", e))?;
    let service = SchedulerGrpcServer::new(scheduler)
        .max_decoding_message_size(MESSAGE_BYTES)
        .max_encoding_message_size(MESSAGE_BYTES);
    with_tls(
        create_grpc_server(&GrpcServerConfig::default()),
        secret.serving_tls()?,
    )
    .map_err(|e| cluster_error("the scheduler's TLS certificate or key", e))?
    .add_service(InterceptedService::new(service, secret.interceptor()))
    .serve_with_incoming(TcpListenerStream::new(listener))
    .await
    .map_err(|e| cluster_error(&format!("the scheduler on {bind} stopped"), e))
}

/// An executor's Arrow Flight service over `work_dir`, refusing callers
/// without `secret`.
fn flight_service(
    work_dir: String,
    secret: &ClusterSecret,
) -> InterceptedService<
    FlightServiceServer<BallistaFlightService>,
    impl tonic::service::Interceptor + Clone + use<>,
> {
    let service = FlightServiceServer::new(BallistaFlightService::new(work_dir))
        .max_decoding_message_size(MESSAGE_BYTES)
        .max_encoding_message_size(MESSAGE_BYTES);
    InterceptedService::new(service, secret.interceptor())
}

/// Runs a scheduler on `bind`, decoding `jobs` and refusing callers without
/// `secret`, until the process ends.
pub async fn run_scheduler(bind: SocketAddr, jobs: Jobs, secret: ClusterSecret) -> Result<()> {
    let listener = TcpListener::bind(bind)
        .await
        .map_err(|e| cluster_error(&format!("cannot listen on {bind}"), e))?;
    serve_scheduler(listener, scheduler_config(bind, &jobs, &secret), &secret).await
}

/// A connection to the scheduler at `url` (`http://HOST:PORT`) that
/// carries `secret`, once the scheduler has taken it; `who` names the
/// caller in the error when it refuses.
pub(crate) async fn admitted(
    url: &str,
    secret: &ClusterSecret,
    who: &str,
) -> Result<SchedulerGrpcClient<Channel>> {
    let unreachable = |e: &dyn std::fmt::Display| {
        Error::Config(format!(
            "cannot reach the icestage scheduler at {url}: {e}; is `icestage scheduler` running \
             there, and do both sides agree on TLS? (a TLS cluster's clients name its authority: \
             icestage.cluster_tls_ca_file or {}; its executors --tls-cert, --tls-key and \
             --tls-ca)",
            super::auth::TLS_FILE_VARIABLES[2]
        ))
    };
    let endpoint = create_grpc_client_endpoint(url.to_string(), None)
        .map_err(|e| unreachable(&e))
        .and_then(|e| (secret.endpoint_override())(e).map_err(|e| unreachable(&e)))?;
    let start = std::time::Instant::now();
    let channel = loop {
        match endpoint.connect().await {
            Ok(channel) => break channel,
            // Nobody listening yet (a scheduler starting): wait for it.
            Err(e) if refused(&e) && start.elapsed() < CONNECT => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            // A port that answers in another protocol (TLS and plain) will
            // not change its mind.
            Err(e) => return Err(unreachable(&error_chain(&e))),
        }
    };
    let mut client = SchedulerGrpcClient::new(channel)
        .max_decoding_message_size(MESSAGE_BYTES)
        .max_encoding_message_size(MESSAGE_BYTES);
    // Any call shows whether the secret is taken; this one changes nothing.
    let asked = client
        .get_job_status(GetJobStatusParams {
            job_id: "icestage-admission".to_string(),
        })
        .await;
    match asked {
        Err(refused) if refused.code() == tonic::Code::Unauthenticated => {
            Err(Error::Config(format!(
                "the icestage scheduler at {url} refused this {who}: {}",
                refused.message()
            )))
        }
        // The call never reached a handler (a status with a transport
        // error beneath it, not one a handler answered).
        Err(lost) if std::error::Error::source(&lost).is_some() => {
            Err(unreachable(&error_chain(&lost)))
        }
        _ => Ok(client),
    }
}

/// `server`, serving TLS when `tls` says how.
fn with_tls(
    server: tonic::transport::Server,
    tls: Option<tonic::transport::ServerTlsConfig>,
) -> std::result::Result<tonic::transport::Server, tonic::transport::Error> {
    match tls {
        Some(tls) => server.tls_config(tls),
        None => Ok(server),
    }
}

/// Whether `error` is a refused TCP connection (nothing listens there).
fn refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        source = error.source();
    }
    false
}

/// `error` with its causes, `: `-separated (a transport error's own text
/// says only "transport error").
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
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
    /// The cluster's secret: the scheduler refuses an executor without it,
    /// and this executor's port refuses callers without it.
    pub secret: ClusterSecret,
}

/// Runs an executor, decoding `jobs`, until the process ends (or the
/// scheduler stops it). An executor the scheduler refuses stops at once.
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
    let secret = options.secret;
    admitted(
        &format!("http://{host}:{scheduler_port}"),
        &secret,
        "executor",
    )
    .await?;
    let flight_secret = secret.clone();
    let flight_tls = secret.serving_tls()?;
    let config = ExecutorProcessConfig {
        bind_host: options.bind.ip().to_string(),
        external_host: Some(options.bind.ip().to_string()),
        port: options.bind.port(),
        scheduler_host: host.to_string(),
        scheduler_port,
        scheduler_connect_timeout_seconds: CONNECT.as_secs() as u16,
        concurrent_tasks: options.concurrent_tasks,
        task_scheduling_policy: TaskSchedulingPolicy::PullStaged,
        work_dir: options.work_dir,
        grpc_max_decoding_message_size: MESSAGE_BYTES as u32,
        grpc_max_encoding_message_size: MESSAGE_BYTES as u32,
        override_config_producer: Some(config_producer(&jobs, &secret)),
        override_logical_codec: Some(Arc::new(IcestageLogicalCodec::new(jobs.clone()))),
        override_physical_codec: Some(Arc::new(IcestagePhysicalCodec::new(jobs))),
        override_create_grpc_client_endpoint: Some(secret.endpoint_override()),
        override_arrow_flight_service: Some(Arc::new(
            move |work_dir, address, mut shutdown, grpc| {
                let service = flight_service(work_dir, &flight_secret);
                let tls = flight_tls.clone();
                tokio::spawn(async move {
                    with_tls(create_grpc_server(&grpc), tls)
                        .map_err(BallistaError::TonicError)?
                        .add_service(service)
                        .serve_with_shutdown(address, shutdown.recv())
                        .await
                        .map_err(BallistaError::TonicError)
                })
            },
        )),
        ..Default::default()
    };
    start_executor_process(Arc::new(config))
        .await
        .map_err(|e| cluster_error("the executor stopped", e))
}

/// Starts a scheduler and `executors` executors inside this process (each
/// with its own sessions, codecs and runtime, as separate processes would
/// have), decoding `jobs`, and returns the cluster's URL,
/// `df://127.0.0.1:PORT`. Its ports take only this process's calls: they
/// want a secret made here, which clients of this process find by the URL.
pub async fn start_in_process(
    executors: usize,
    concurrent_tasks: usize,
    jobs: Jobs,
) -> Result<String> {
    let secret = ClusterSecret::random();
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| cluster_error("cannot start the in-process scheduler", e))?;
    let bind = listener
        .local_addr()
        .map_err(|e| cluster_error("cannot start the in-process scheduler", e))?;
    let config = scheduler_config(bind, &jobs, &secret);
    let serving = secret.clone();
    tokio::spawn(async move {
        if let Err(e) = serve_scheduler(listener, config, &serving).await {
            eprintln!("icestage: the in-process scheduler stopped: {e}");
        }
    });
    let scheduler = admitted(&format!("http://{bind}"), &secret, "in-process executor").await?;
    for _ in 0..executors.max(1) {
        start_executor_here(scheduler.clone(), concurrent_tasks.max(1), &jobs, &secret).await?;
    }
    let url = format!("df://{bind}");
    super::auth::remember(&url, &secret);
    Ok(url)
}

/// One executor inside this process, polling `scheduler`.
async fn start_executor_here(
    scheduler: SchedulerGrpcClient<Channel>,
    concurrent_tasks: usize,
    jobs: &Jobs,
    secret: &ClusterSecret,
) -> Result<()> {
    let failed =
        |e: &dyn std::fmt::Display| cluster_error("cannot start an in-process executor", e);
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| failed(&e))?;
    let address = listener.local_addr().map_err(|e| failed(&e))?;
    let work_dir = tempfile::tempdir().map_err(|e| failed(&e))?.keep();
    let work_dir = work_dir.to_string_lossy().into_owned();
    let registration = ExecutorRegistration {
        id: uuid::Uuid::new_v4().to_string(),
        host: Some(address.ip().to_string()),
        port: u32::from(address.port()),
        // Not served: tasks are pulled.
        grpc_port: 0,
        specification: Some(
            ExecutorSpecification::default()
                .with_task_slots(concurrent_tasks as u32)
                .into(),
        ),
        os_info: Some(ExecutorOperatingSystemSpecification::default().into()),
    };
    let executor = Arc::new(Executor::with_default_execution_engine(
        registration,
        &work_dir,
        Arc::new(|_| Ok(Arc::new(RuntimeEnvBuilder::new().build()?))),
        config_producer(jobs, secret),
        Arc::new(BallistaFunctionRegistry::default()),
        Arc::new(LoggingMetricsCollector::default()),
        concurrent_tasks,
    ));
    tokio::spawn(
        create_grpc_server(&GrpcServerConfig::default())
            .add_service(flight_service(work_dir, secret))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    tokio::spawn(ballista_executor::execution_loop::poll_loop(
        scheduler,
        executor,
        codec(jobs),
    ));
    Ok(())
}
