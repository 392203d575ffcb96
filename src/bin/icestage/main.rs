//! `icestage`: an interactive SQL shell over Iceberg catalogs with icestage's
//! statements, built on datafusion-cli's printing.

mod progress;
mod shell;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use std::io::IsTerminal;
use std::sync::Arc;

use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_cli::print_format::PrintFormat;
use datafusion_cli::print_options::MaxRows;
use icestage::memory::Churn;
use icestage::{IcestageConfig, ProgressSink};

use crate::shell::Shell;

/// The service allocates and frees many small, short-lived values per
/// request (metadata JSON, Avro schemas, manifest entries) from many
/// threads; under its load test glibc's allocator spent about a quarter of
/// the CPU time in `malloc`/`free`.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Staged bulk uploads and downloads over Apache Iceberg, in SQL.
#[derive(Debug, Parser)]
#[command(name = "icestage", version, about)]
struct Args {
    /// Run this SQL (statements separated by ';'); repeatable, then exit.
    #[arg(short = 'c', long = "command")]
    commands: Vec<String>,

    /// Run the SQL script in FILE; repeatable, then exit.
    #[arg(short = 'f', long = "file")]
    files: Vec<PathBuf>,

    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,

    /// Print only results: no row counts or timings.
    #[arg(short, long)]
    quiet: bool,

    /// Rows shown per result in table format ('inf' for all).
    #[arg(long, default_value = "40")]
    maxrows: MaxRows,

    /// Folder of the embedded catalog (SQLite file and warehouse), created on first use.
    #[arg(long, default_value = "./warehouse", conflicts_with = "catalog_config")]
    warehouse: PathBuf,

    /// TOML file with one [[catalogs]] entry per catalog, instead of --warehouse.
    #[arg(long)]
    catalog_config: Option<PathBuf>,

    #[command(subcommand)]
    command: Option<Subcommand>,
}

#[derive(Debug, clap::Subcommand)]
enum Subcommand {
    /// Run the upload/download HTTP API (see the book's HTTP service page, docs/src/guide/service.md).
    Serve {
        /// Service config: catalogs, listen address, tokens, webhook.
        #[arg(long)]
        config: PathBuf,
    },
    /// Run a Ballista scheduler with icestage's codecs (needs the `cluster`
    /// feature). Scheduler, executors and every client that sets
    /// icestage.cluster must be the same icestage build.
    #[cfg(feature = "cluster")]
    Scheduler {
        /// Address to listen on; clients use `SET icestage.cluster = 'df://HOST:PORT'`.
        #[arg(long, default_value = "127.0.0.1:50050")]
        bind: std::net::SocketAddr,
        /// File holding the cluster's shared secret (else the file
        /// ICESTAGE_CLUSTER_SECRET_FILE names): callers without it are refused.
        #[arg(long)]
        secret_file: Option<PathBuf>,
        #[command(flatten)]
        tls: TlsFiles,
    },
    /// Run a Ballista executor with icestage's codecs (needs the `cluster`
    /// feature). Scheduler, executors and clients must be the same icestage
    /// build; the executor must reach the tables' storage as the client does.
    #[cfg(feature = "cluster")]
    Executor {
        /// The scheduler's HOST:PORT.
        #[arg(long)]
        scheduler: String,
        /// Address for shuffle reads from other executors (Arrow Flight).
        #[arg(long, default_value = "127.0.0.1:50051")]
        bind: std::net::SocketAddr,
        /// Folder for shuffle files (a temporary folder when not given).
        #[arg(long)]
        work_dir: Option<PathBuf>,
        /// Tasks run at once (0: one per core).
        #[arg(long, default_value_t = 0)]
        concurrent_tasks: usize,
        /// File holding the cluster's shared secret (else the file
        /// ICESTAGE_CLUSTER_SECRET_FILE names), the scheduler's.
        #[arg(long)]
        secret_file: Option<PathBuf>,
        #[command(flatten)]
        tls: TlsFiles,
    },
}

/// A cluster process's TLS (PEM files): with a certificate and its key it
/// serves only TLS and opens only TLS connections.
#[cfg(feature = "cluster")]
#[derive(Debug, clap::Args)]
struct TlsFiles {
    /// This process's certificate (else the file
    /// ICESTAGE_CLUSTER_TLS_CERT_FILE names); it must name the address
    /// peers reach the process at (an IP address in its subject
    /// alternative names when they use one).
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (else ICESTAGE_CLUSTER_TLS_KEY_FILE).
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// The authority every cluster certificate chains to (else
    /// ICESTAGE_CLUSTER_TLS_CA_FILE; without one, the certificate itself).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
}

/// How results are printed.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Format {
    Table,
    Csv,
    Tsv,
    Json,
    Ndjson,
}

impl From<Format> for PrintFormat {
    fn from(format: Format) -> Self {
        match format {
            Format::Table => PrintFormat::Table,
            Format::Csv => PrintFormat::Csv,
            Format::Tsv => PrintFormat::Tsv,
            Format::Json => PrintFormat::Json,
            Format::Ndjson => PrintFormat::NdJson,
        }
    }
}

/// glibc's allocator returns each freed block above a threshold to the
/// kernel and gets it back as fresh zeroed pages on the next batch; decoding
/// Parquet in batches then spends a tenth of its time faulting pages in.
/// Keeping large blocks in the heap (and the heap untrimmed up to 256 MiB)
/// reuses them instead.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only tunes the allocator; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

/// mimalloc (v3) keeps freed pages for a second before it gives them back
/// to the kernel, and backs its arenas with transparent huge pages where the
/// kernel allows (`madvise`), so a page is given back only when all of its
/// 2 MiB are free. A download or a promotion frees each batch it has written,
/// so the last second's batches stayed resident and counted in the peak: a
/// 20M-row download (`scripts/bench-download.sh`) peaked at 293 to 347 MiB.
/// Freed pages now go back after [`PURGE_DELAY_MS`] and the process uses
/// small pages: 221 to 234 MiB, 2.7 s becoming 3.0 s. Purging on every free
/// (a delay of 0) costs a system call per page: 215 to 228 MiB at 4.8 to 5 s.
/// While bulk work runs, freed memory stays longer (see `icestage::memory`):
/// [`VERIFYING_PURGE_DELAY_MS`] while verification decodes (a promotion of
/// 10M rows took 268 ms instead of 294, median of 7, at a peak about 25 MiB
/// higher), [`LOADING_PURGE_DELAY_MS`] while a load writes (COPY INTO of
/// TPC-H's lineitem from 8 Parquet files: median 3.7 s instead of 4.9, a
/// third of the system time, at a peak of about 390 MiB instead of 285).
/// `MIMALLOC_PURGE_DELAY` and `MIMALLOC_ALLOW_THP` still override each.
fn return_freed_memory_soon() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        set_purge_delay(Churn::Idle);
        icestage::memory::on_churn(set_purge_delay);
    }
}

/// Small pages from the very first allocation (see
/// [`return_freed_memory_soon`]). mimalloc maps its first memory before
/// `main` runs, and memory mapped before the process refuses transparent
/// huge pages still takes them: an `icestage --version` zeroed two 2 MiB
/// pages, about 1 ms of its 8 (`perf stat -r 40`: 7.2 ms against 8.2 with
/// `MIMALLOC_ALLOW_THP=0`, which has mimalloc refuse them when it starts).
/// A function in `.preinit_array` runs before every constructor of the
/// executable, mimalloc's among them.
#[cfg(target_os = "linux")]
#[used]
#[unsafe(link_section = ".preinit_array")]
static SMALL_PAGES_FROM_THE_START: extern "C" fn() = small_pages;

/// What mimalloc itself does with `MIMALLOC_ALLOW_THP=0`, unless that
/// variable chooses otherwise.
#[cfg(target_os = "linux")]
extern "C" fn small_pages() {
    // SAFETY: getenv reads the environment before any thread exists;
    // prctl with PR_SET_THP_DISABLE only sets a flag of this process.
    unsafe {
        if libc::getenv(c"MIMALLOC_ALLOW_THP".as_ptr()).is_null() {
            libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
        }
    }
}

/// Sets how long freed memory stays: longer while bulk work runs.
fn set_purge_delay(churn: Churn) {
    let delay = match churn {
        Churn::Idle => PURGE_DELAY_MS,
        Churn::Verifying => VERIFYING_PURGE_DELAY_MS,
        Churn::Loading => LOADING_PURGE_DELAY_MS,
    };
    // SAFETY: mi_option_set stores the option's value, which mimalloc reads
    // when it next schedules a purge; nothing else.
    unsafe { allocator::mi_option_set(allocator::PURGE_DELAY, delay) };
}

/// How long freed memory stays with the process, in milliseconds.
const PURGE_DELAY_MS: std::ffi::c_long = 10;
/// The same while verification decodes staged files.
const VERIFYING_PURGE_DELAY_MS: std::ffi::c_long = 100;
/// The same while a load writes data files.
const LOADING_PURGE_DELAY_MS: std::ffi::c_long = 1000;

/// The part of mimalloc's C API the binary tunes.
mod allocator {
    use std::ffi::{c_int, c_long};

    /// `mi_option_purge_delay` in mimalloc v3's `mimalloc.h` (the 16th
    /// option); a test checks it is the option whose default is 1000 ms.
    pub(crate) const PURGE_DELAY: c_int = 15;

    unsafe extern "C" {
        pub(crate) fn mi_option_set(option: c_int, value: c_long);
        #[cfg(test)]
        pub(crate) fn mi_option_get(option: c_int) -> c_long;
    }
}

/// iceberg-rust builds an error value (and, with `RUST_BACKTRACE` set,
/// captures a backtrace for it) in paths that then discard it, per column of
/// every batch it reads: with `RUST_BACKTRACE=1`, capturing those
/// backtraces was about a twentieth of a profile of 10,000 uploads (status
/// reads and listings of the upload log). Library backtraces are off unless
/// `RUST_LIB_BACKTRACE` asks for them; a panic still prints its backtrace
/// under `RUST_BACKTRACE`.
fn no_library_backtraces() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // SAFETY: called first in `main`, before any other thread starts.
        unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    }
}

fn main() -> ExitCode {
    no_library_backtraces();
    keep_freed_memory();
    return_freed_memory_soon();
    tokio::runtime::Builder::new_multi_thread()
        // DataFusion's and Ballista's plan walks recurse; Ballista's own
        // processes run with this stack too.
        .thread_stack_size(32 << 20)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(main_async())
}

async fn main_async() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("Error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The cluster's secret a scheduler or executor is started with: there is
/// no cluster without one.
#[cfg(feature = "cluster")]
fn cluster_secret(
    role: &str,
    file: Option<&std::path::Path>,
    tls: &TlsFiles,
) -> icestage::Result<icestage::processes::ClusterSecret> {
    let secret = icestage::processes::ClusterSecret::from_file_or_env(file)?.ok_or_else(|| {
        icestage::Error::Config(format!(
            "icestage {role} needs the cluster's secret, shared by the scheduler, every executor \
             and every client: --secret-file PATH or {}=PATH (make one with `head -c 32 \
             /dev/urandom | base64 > cluster.secret`)",
            icestage::processes::SECRET_FILE_VARIABLE
        ))
    })?;
    let tls = icestage::processes::ClusterTls::from_files_or_env(
        tls.tls_cert.as_deref(),
        tls.tls_key.as_deref(),
        tls.tls_ca.as_deref(),
    )?;
    Ok(secret.with_tls(tls))
}

/// Runs a cluster process (`role`) until it ends or SIGTERM or Ctrl-C
/// comes; then the process ends at once. Ballista's loops neither stop on a
/// signal nor end when their scheduler is gone (an executor keeps polling
/// it), so nothing waits for them.
#[cfg(feature = "cluster")]
async fn until_stopped(
    role: &str,
    process: impl std::future::Future<Output = icestage::Result<()>>,
) -> icestage::Result<()> {
    tokio::select! {
        ended = process => ended,
        () = icestage::service::shutdown_signal() => {
            eprintln!("icestage {role} stopping: asked to");
            std::process::exit(0)
        }
    }
}

async fn run(args: Args) -> icestage::Result<ExitCode> {
    match &args.command {
        Some(Subcommand::Serve { config }) => {
            icestage::service::serve(icestage::service::ServiceConfig::from_file(config)?).await?;
            return Ok(ExitCode::SUCCESS);
        }
        #[cfg(feature = "cluster")]
        Some(Subcommand::Scheduler {
            bind,
            secret_file,
            tls,
        }) => {
            let secret = cluster_secret("scheduler", secret_file.as_deref(), tls)?;
            log_tasks();
            eprintln!("icestage scheduler listening on {bind}");
            until_stopped(
                "scheduler",
                icestage::processes::run_scheduler(*bind, secret),
            )
            .await?;
            return Ok(ExitCode::SUCCESS);
        }
        #[cfg(feature = "cluster")]
        Some(Subcommand::Executor {
            scheduler,
            bind,
            work_dir,
            concurrent_tasks,
            secret_file,
            tls,
        }) => {
            let secret = cluster_secret("executor", secret_file.as_deref(), tls)?;
            log_tasks();
            eprintln!("icestage executor on {bind}, scheduler {scheduler}");
            let options = icestage::processes::ExecutorOptions {
                scheduler: scheduler.clone(),
                bind: *bind,
                work_dir: work_dir.as_ref().map(|d| d.display().to_string()),
                concurrent_tasks: *concurrent_tasks,
                secret,
            };
            until_stopped("executor", icestage::processes::run_executor(options)).await?;
            return Ok(ExitCode::SUCCESS);
        }
        None => {}
    }
    let config = match &args.catalog_config {
        Some(path) => IcestageConfig::from_toml_file(path)?,
        None => IcestageConfig::embedded(&args.warehouse)?,
    };
    // A progress bar for long loads, only where someone watches.
    let mut session = SessionConfig::new();
    if std::io::stderr().is_terminal() {
        session = session.with_extension(Arc::new(ProgressSink::new(Arc::new(
            progress::Bar::default(),
        ))));
    }
    let ctx = SessionContext::new_with_config(session);
    let service = icestage::register(&ctx, config).await?;
    let interactive = args.commands.is_empty() && args.files.is_empty();
    let mut shell = Shell::new(ctx, args.format.into(), args.quiet, args.maxrows);
    let code = if interactive {
        shell.repl().await;
        ExitCode::SUCCESS
    } else {
        run_scripts(&mut shell, &args).await?
    };
    // Downloads this process is filling finish before it exits.
    service.finish_background_work().await;
    Ok(code)
}

/// Cluster processes print Ballista's progress (tasks received and done)
/// to standard error; `RUST_LOG` chooses more or less.
#[cfg(feature = "cluster")]
fn log_tasks() {
    env_logger::Builder::from_env(
        env_logger::Env::default()
            .default_filter_or("warn,ballista_executor=info,ballista_scheduler=info"),
    )
    .init();
}

async fn run_scripts(shell: &mut Shell, args: &Args) -> icestage::Result<ExitCode> {
    for command in &args.commands {
        if !shell.run_script(command).await {
            return Ok(ExitCode::FAILURE);
        }
    }
    for file in &args.files {
        let text = std::fs::read_to_string(file).map_err(|e| {
            icestage::Error::InvalidInput(format!("cannot read script '{}': {e}", file.display()))
        })?;
        if !shell.run_script(&text).await {
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::Churn;
    use super::allocator::{PURGE_DELAY, mi_option_get};

    #[test]
    fn freed_memory_goes_back_soon_in_small_pages() {
        // SAFETY: reads one allocator option; no other test here.
        let default = unsafe { mi_option_get(PURGE_DELAY) };
        super::return_freed_memory_soon();
        // SAFETY: as above.
        let set = unsafe { mi_option_get(PURGE_DELAY) };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(
                default, 1000,
                "option {PURGE_DELAY} is not mimalloc's purge delay"
            );
            assert_eq!(set, super::PURGE_DELAY_MS);
            // While bulk work runs, and after.
            let mut delays = vec![];
            for churn in [Churn::Verifying, Churn::Loading, Churn::Idle] {
                super::set_purge_delay(churn);
                // SAFETY: as above.
                delays.push(unsafe { mi_option_get(PURGE_DELAY) });
            }
            assert_eq!(
                delays,
                [
                    super::VERIFYING_PURGE_DELAY_MS,
                    super::LOADING_PURGE_DELAY_MS,
                    super::PURGE_DELAY_MS
                ]
            );
        }
        // Set before `main`, by `small_pages` in `.preinit_array`.
        #[cfg(target_os = "linux")]
        if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
            // SAFETY: reads a flag of this process.
            let disabled = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
            assert_eq!(disabled, 1, "transparent huge pages are still allowed");
        }
    }
}
