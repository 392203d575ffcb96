//! PROMOTE's rule scans and CREATE DOWNLOAD's query on a Ballista cluster:
//! the same findings and rows as in this process, on an in-process cluster
//! and on a scheduler with two executor processes; an executor killed
//! mid-job leaves a complete download or none; every port refuses a peer
//! without the cluster's secret.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::prelude::SessionContext;

use crate::common::{Warehouse, create_upload, free_port, run, scalar, value};

/// A partitioned target with a UNIQUE and a CHECK rule, in many data files.
async fn target(ctx: &SessionContext) {
    for sql in [
        "CREATE SCHEMA payments",
        "CREATE TABLE payments.transactions (transaction_id VARCHAR NOT NULL, \
         account_id VARCHAR NOT NULL, amount_cents BIGINT NOT NULL, currency VARCHAR NOT NULL) \
         PARTITIONED BY (bucket(4, account_id))",
        "ALTER TABLE payments.transactions ADD CONSTRAINT one_row_per_txn UNIQUE (transaction_id)",
        "ALTER TABLE payments.transactions ADD CONSTRAINT positive CHECK (amount_cents > 0)",
    ] {
        run(ctx, sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    for file in 0..6 {
        let rows: Vec<String> = (0..50)
            .map(|i| {
                let n = file * 50 + i;
                format!("('t{n}', 'acct_{}', {}, 'usd')", n % 7, 100 + n)
            })
            .collect();
        run(
            ctx,
            &format!(
                "INSERT INTO payments.transactions VALUES {}",
                rows.join(", ")
            ),
        )
        .await
        .unwrap();
    }
}

/// An upload with a key already in the target, a key twice, a negative
/// amount and a clean row, in three files.
async fn upload_with_findings(ctx: &SessionContext) -> String {
    let upload = create_upload(ctx, "payments.transactions").await;
    for rows in [
        "('t7', 'acct_1', 5, 'usd'), ('n1', 'acct_2', 6, 'usd')",
        "('n1', 'acct_2', 7, 'usd'), ('n2', 'acct_3', -8, 'usd')",
        "('n3', 'acct_4', 9, 'usd')",
    ] {
        run(
            ctx,
            &format!("INSERT INTO {} VALUES {rows}", upload.staging_table),
        )
        .await
        .unwrap();
    }
    upload.id
}

/// The findings of upload `id`, as text.
async fn findings(ctx: &SessionContext, id: &str) -> String {
    let batches = run(
        ctx,
        &format!(
            "SELECT rule, kind, row, message FROM upload_findings('{id}') ORDER BY rule, row, message"
        ),
    )
    .await
    .unwrap();
    pretty_format_batches(&batches).unwrap().to_string()
}

/// Names the cluster at `url` in `ctx`, with its secret file (none for an
/// in-process cluster, whose secret this process knows).
async fn set_cluster(ctx: &SessionContext, url: &str, secret: Option<&Path>) {
    run(ctx, &format!("SET icestage.cluster = '{url}'"))
        .await
        .unwrap();
    if let Some(secret) = secret {
        let file = secret.display();
        run(ctx, &format!("SET icestage.cluster_secret_file = '{file}'"))
            .await
            .unwrap();
    }
}

/// A download's rows, as text, and what CREATE DOWNLOAD said of where it ran.
async fn download(ctx: &SessionContext) -> (String, String, String) {
    let opened = run(
        ctx,
        "CREATE DOWNLOAD WITH (wait = true) AS \
         SELECT t.account_id, count(*) AS n, sum(t.amount_cents) AS total, max(o.transaction_id) AS last \
         FROM payments.transactions t JOIN payments.transactions o ON t.transaction_id = o.transaction_id \
         WHERE t.amount_cents > 120 GROUP BY t.account_id",
    )
    .await
    .unwrap();
    assert_eq!(value(&opened, "state"), "ready");
    let id = value(&opened, "download_id");
    let rows = run(
        ctx,
        &format!(
            "SELECT * FROM {} ORDER BY account_id",
            value(&opened, "download_table")
        ),
    )
    .await
    .unwrap();
    let message = scalar(
        ctx,
        &format!("SELECT coalesce(message, '') FROM download_status('{id}')"),
    )
    .await;
    (
        pretty_format_batches(&rows).unwrap().to_string(),
        value(&opened, "ran_on"),
        message,
    )
}

/// Runs the same promotions and download here and on `url`, and checks
/// that they agree.
async fn same_here_and_on(url: &str, secret: Option<&Path>) {
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    target(&ctx).await;

    // Rules: the same findings from the local scans and the cluster's.
    let id = upload_with_findings(&ctx).await;
    let local = run(
        &ctx,
        &format!("PROMOTE UPLOAD '{id}' WITH (dry_run = true)"),
    )
    .await
    .unwrap();
    assert_eq!(value(&local, "ran_on"), "local");
    let here = findings(&ctx, &id).await;
    assert!(here.contains("already in the target"), "{here}");
    assert!(here.contains("more than once"), "{here}");
    assert!(here.contains("positive"), "{here}");

    let remote = warehouse.session().await;
    set_cluster(&remote, url, secret).await;
    let on_cluster = run(
        &remote,
        &format!("PROMOTE UPLOAD '{id}' WITH (dry_run = true)"),
    )
    .await
    .unwrap();
    assert_eq!(value(&on_cluster, "ran_on"), url);
    assert_eq!(value(&on_cluster, "findings"), value(&local, "findings"));
    assert_eq!(findings(&remote, &id).await, here);

    // A clean upload promotes from the cluster's verdict, once.
    let clean = create_upload(&remote, "payments.transactions").await;
    run(
        &remote,
        &format!(
            "INSERT INTO {} VALUES ('c1', 'acct_1', 1, 'usd'), ('c2', 'acct_2', 2, 'usd')",
            clean.staging_table
        ),
    )
    .await
    .unwrap();
    let promoted = run(&remote, &format!("PROMOTE UPLOAD '{}'", clean.id))
        .await
        .unwrap();
    assert_eq!(value(&promoted, "state"), "promoted");
    assert_eq!(value(&promoted, "ran_on"), url);
    assert_eq!(
        scalar(
            &ctx,
            "SELECT count(*) FROM payments.transactions WHERE transaction_id IN ('c1', 'c2')"
        )
        .await,
        "2"
    );

    // A download: the same rows from a join and an aggregate.
    let (rows_here, ran_here, _) = download(&ctx).await;
    let (rows_there, ran_there, message) = download(&remote).await;
    assert_eq!(ran_here, "local");
    assert_eq!(ran_there, url);
    assert!(message.contains("written on the cluster"), "{message}");
    assert!(message.contains(url), "{message}");
    assert_eq!(rows_there, rows_here);
    assert!(rows_here.contains("acct_6"), "{rows_here}");

    // COPY INTO: the executors read the files (plain and gzip CSV) and write
    // the data files; the same rows land, once, and again loads nothing.
    let (here, there) = (
        copy(&ctx, "orders_here").await,
        copy(&remote, "orders_there").await,
    );
    assert_eq!(value(&here, "ran_on"), "local");
    assert_eq!(value(&there, "ran_on"), url);
    assert_eq!(value(&there, "files_loaded"), "3");
    assert_eq!(value(&there, "rows"), value(&here, "rows"));
    let rows = |table: &'static str| {
        let ctx = &ctx;
        async move {
            let batches = run(ctx, &format!("SELECT * FROM raw.{table} ORDER BY order_id"))
                .await
                .unwrap();
            pretty_format_batches(&batches).unwrap().to_string()
        }
    };
    assert_eq!(rows("orders_there").await, rows("orders_here").await);
    let again = copy(&remote, "orders_there").await;
    assert_eq!(value(&again, "files_loaded"), "0");

    // A pipe run in a session with the cluster set loads through it too.
    let orders = crate::common::repo().join("sql/data/orders/");
    run(
        &remote,
        &format!(
            "CREATE PIPE orders AS COPY INTO raw.orders_piped FROM '{}' WITH (format = 'csv')",
            orders.display()
        ),
    )
    .await
    .unwrap();
    let piped = run(&remote, "RUN PIPE orders").await.unwrap();
    assert_eq!(value(&piped, "files_loaded"), "3");
    assert_eq!(rows("orders_piped").await, rows("orders_here").await);
}

/// COPY INTO raw.<table> of the repository's sample orders.
async fn copy(ctx: &SessionContext, table: &str) -> Vec<datafusion::arrow::array::RecordBatch> {
    let orders = crate::common::repo().join("sql/data/orders/");
    run(
        ctx,
        &format!(
            "COPY INTO raw.{table} FROM '{}' WITH (all_files = true)",
            orders.display()
        ),
    )
    .await
    .unwrap()
}

/// Runs `test` on a runtime whose threads have the stack Ballista's own
/// processes give theirs (its plan encoding recurses deeply in debug builds).
fn on_cluster_stack<F: std::future::Future<Output = ()> + Send + 'static>(test: F) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .thread_stack_size(32 << 20)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async { tokio::spawn(test).await.unwrap() });
}

#[test]
fn an_in_process_cluster_gives_the_same_findings_and_rows() {
    on_cluster_stack(async {
        let url = icestage::processes::start_in_process(2, 2).await.unwrap();
        same_here_and_on(&url, None).await;
    });
}

/// A cluster process whose standard error is kept.
struct Process {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Process {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_icestage"))
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start icestage");
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().unwrap();
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut text = sink.lock().unwrap();
                text.push_str(&line);
                text.push('\n');
            }
        });
        Self { child, stderr }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits for the process to end by itself: its exit status and
    /// standard error.
    async fn ended(&mut self, timeout: Duration) -> (std::process::ExitStatus, String) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // What it wrote last may still be on its way through the pipe.
                tokio::time::sleep(Duration::from_millis(300)).await;
                return (status, self.stderr());
            }
            assert!(
                start.elapsed() < timeout,
                "still running after {timeout:?}; stderr:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for the process to fail by itself, saying `needle`.
    async fn fails_saying(&mut self, needle: &str, timeout: Duration) {
        let (status, stderr) = self.ended(timeout).await;
        assert!(!status.success() && stderr.contains(needle), "{stderr}");
    }

    async fn wait_for(&self, needle: &str, timeout: Duration) {
        let start = Instant::now();
        while !self.stderr().contains(needle) {
            assert!(
                start.elapsed() < timeout,
                "no '{needle}' within {timeout:?}; stderr:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A new file holding a cluster secret `text`.
fn secret_file(text: &str) -> PathBuf {
    let path = tempfile::tempdir().unwrap().keep().join("cluster.secret");
    std::fs::write(&path, text).unwrap();
    path
}

/// A scheduler process on a free port, started with `secret`.
fn scheduler(secret: &Path) -> (String, Process) {
    scheduler_with(secret, &[])
}

/// [`scheduler`] with `extra` arguments.
fn scheduler_with(secret: &Path, extra: &[&str]) -> (String, Process) {
    let address = format!("127.0.0.1:{}", free_port());
    let mut args = vec![
        "scheduler",
        "--bind",
        &address,
        "--secret-file",
        secret.to_str().unwrap(),
    ];
    args.extend(extra);
    let process = Process::start(&args, &[]);
    (address, process)
}

/// An executor process of the scheduler at `scheduler` (one task at a time).
fn executor(scheduler: &str, secret: Option<&Path>, env: &[(&str, &str)]) -> (String, Process) {
    executor_with(scheduler, secret, &[], env)
}

/// [`executor`] with `extra` arguments.
fn executor_with(
    scheduler: &str,
    secret: Option<&Path>,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (String, Process) {
    let bind = format!("127.0.0.1:{}", free_port());
    let work = tempfile::tempdir().unwrap().keep();
    let mut args = vec![
        "executor",
        "--scheduler",
        scheduler,
        "--bind",
        &bind,
        "--work-dir",
        work.to_str().unwrap(),
        "--concurrent-tasks",
        "1",
    ];
    if let Some(secret) = secret {
        args.extend(["--secret-file", secret.to_str().unwrap()]);
    }
    args.extend(extra);
    let process = Process::start(&args, env);
    (bind, process)
}

/// A scheduler and two executor processes sharing a secret (one task at a
/// time each, so the tasks spread), the first with `env`: the cluster's
/// URL, its secret file and the processes.
async fn cluster(env: &[(&str, &str)]) -> (String, PathBuf, Process, Vec<Process>) {
    let secret = secret_file("a-secret-the-cluster-shares");
    let (address, scheduler_process) = scheduler(&secret);
    let mut executors = vec![];
    for n in 0..2 {
        let env = if n == 0 { env } else { &[] };
        executors.push(executor(&address, Some(&secret), env).1);
    }
    for executor in &executors {
        executor
            .wait_for("poll work loop", Duration::from_secs(60))
            .await;
    }
    (
        format!("df://{address}"),
        secret,
        scheduler_process,
        executors,
    )
}

#[test]
fn a_scheduler_and_two_executor_processes_give_the_same_findings_and_rows() {
    on_cluster_stack(two_executor_processes());
}

async fn two_executor_processes() {
    let (url, secret, _scheduler, executors) = cluster(&[]).await;
    same_here_and_on(&url, Some(&secret)).await;
    for (n, executor) in executors.iter().enumerate() {
        let log = executor.stderr();
        assert!(
            log.contains("Done with task"),
            "executor {n} ran no task:\n{log}"
        );
    }
}

#[test]
fn an_executor_killed_mid_job_leaves_a_whole_download_or_none() {
    on_cluster_stack(executor_killed_mid_job());
}

async fn executor_killed_mid_job() {
    // The first executor stops inside its first scan; it is killed there.
    let (url, secret, _scheduler, mut executors) =
        cluster(&[("ICESTAGE_FAILPOINT", "cluster.scan")]).await;
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    target(&ctx).await;
    let expected = scalar(&ctx, "SELECT count(*) FROM payments.transactions").await;
    set_cluster(&ctx, &url, Some(&secret)).await;
    let opened = run(
        &ctx,
        "CREATE DOWNLOAD AS SELECT * FROM payments.transactions",
    )
    .await
    .unwrap();
    let id = value(&opened, "download_id");
    executors[0]
        .wait_for("failpoint cluster.scan reached", Duration::from_secs(60))
        .await;
    let _ = executors[0].child.kill();
    let waited = run(
        &ctx,
        &format!("SELECT state, rows FROM wait_download('{id}', '180s')"),
    )
    .await
    .unwrap();
    let table = value(&opened, "download_table");
    let snapshots = scalar(&ctx, &format!("SELECT count(*) FROM {table}$snapshots")).await;
    eprintln!(
        "after the kill: download {}, {snapshots} snapshot(s)",
        value(&waited, "state")
    );
    match value(&waited, "state").as_str() {
        "ready" => {
            assert_eq!(value(&waited, "rows"), expected);
            assert_eq!(snapshots, "1");
            // Every row once: a retried task's files are not committed twice.
            let counts =
                format!("SELECT count(*) || '/' || count(DISTINCT transaction_id) FROM {table}");
            assert_eq!(
                scalar(&ctx, &counts).await,
                format!("{expected}/{expected}")
            );
        }
        "failed" => assert_eq!(snapshots, "0"),
        other => panic!("download ended {other}"),
    }
    executors.remove(0);

    // A retried task's file that no commit references (put here as one
    // would be) goes with the download, with everything else under it.
    let of_download = || {
        crate::common::files_under(warehouse.path())
            .into_iter()
            .filter(|f| f.to_string_lossy().contains(&format!("download_{id}")))
            .collect::<Vec<_>>()
    };
    let metadata = of_download()
        .into_iter()
        .find(|f| f.to_string_lossy().ends_with(".metadata.json"))
        .expect("the download's metadata file");
    let folder = metadata.parent().unwrap().parent().unwrap().join("data");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join(format!("icestage-download-{id}-0000-stray.parquet")),
        b"x",
    )
    .unwrap();
    run(&ctx, &format!("DROP DOWNLOAD '{id}'")).await.unwrap();
    assert_eq!(of_download(), Vec::<std::path::PathBuf>::new());
}

/// What a download on the session's cluster ends as: its state and message,
/// or the statement's error.
async fn download_outcome(ctx: &SessionContext) -> String {
    let opened = run(
        ctx,
        "CREATE DOWNLOAD WITH (wait = true) AS SELECT count(*) AS n FROM payments.transactions",
    )
    .await;
    match opened {
        Err(e) => e.to_string(),
        Ok(opened) => {
            let id = value(&opened, "download_id");
            let ran_on = value(&opened, "ran_on");
            let status = format!(
                "SELECT state || ': ' || coalesce(message, '') FROM download_status('{id}')"
            );
            format!("{} (ran on {ran_on})", scalar(ctx, &status).await)
        }
    }
}

#[test]
fn a_cluster_refuses_every_peer_without_its_secret() {
    on_cluster_stack(peers_without_the_secret());
}

async fn peers_without_the_secret() {
    use arrow_flight::Ticket;
    use arrow_flight::flight_service_client::FlightServiceClient;
    use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
    use ballista_core::serde::protobuf::{
        ExecuteQueryParams, ExecutorRegistration, PollWorkParams,
    };

    let unset = [("ICESTAGE_CLUSTER_SECRET_FILE", "")];
    // No secret, no scheduler and no executor.
    let bind = format!("127.0.0.1:{}", free_port());
    let mut bare = Process::start(&["scheduler", "--bind", &bind], &unset);
    bare.fails_saying("--secret-file", Duration::from_secs(30))
        .await;

    let secret = secret_file("the-cluster-s-own-secret\n");
    let wrong = secret_file("somebody-else-s-secret");
    let (address, _scheduler) = scheduler(&secret);
    let mut bare = executor(&address, None, &unset).1;
    bare.fails_saying("--secret-file", Duration::from_secs(30))
        .await;

    // An executor with another secret cannot register: it is refused and stops.
    let mut impostor = executor(&address, Some(&wrong), &[]).1;
    let (status, stderr) = impostor.ended(Duration::from_secs(60)).await;
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("refused this executor") && stderr.contains("differs"),
        "{stderr}"
    );
    assert!(!stderr.contains("poll work loop"), "{stderr}");

    // The cluster's own executor is taken.
    let (flight, member) = executor(&address, Some(&secret), &[]);
    member
        .wait_for("poll work loop", Duration::from_secs(60))
        .await;

    // Whoever speaks Ballista's gRPC without the secret can neither take
    // work as an executor, nor submit a job, nor fetch an executor's files.
    let unauthenticated = |status: tonic::Status| {
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status}");
        assert!(
            status.message().contains("sent no cluster secret"),
            "{status}"
        );
    };
    let mut raw = SchedulerGrpcClient::connect(format!("http://{address}"))
        .await
        .unwrap();
    let polled = raw
        .poll_work(PollWorkParams {
            metadata: Some(ExecutorRegistration {
                id: "impostor".to_string(),
                host: Some("127.0.0.1".to_string()),
                port: 1,
                grpc_port: 1,
                specification: None,
                os_info: None,
            }),
            num_free_slots: 4,
            task_status: vec![],
        })
        .await;
    unauthenticated(polled.unwrap_err());
    let submitted = raw.execute_query(ExecuteQueryParams::default()).await;
    unauthenticated(submitted.unwrap_err());
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{flight}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut shuffle = FlightServiceClient::new(channel);
    let fetched = shuffle
        .do_get(Ticket {
            ticket: b"any job's partition".to_vec().into(),
        })
        .await;
    unauthenticated(fetched.unwrap_err());

    // A client session without the secret, or with another, submits nothing.
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    target(&ctx).await;
    let url = format!("df://{address}");
    set_cluster(&ctx, &url, None).await;
    let outcome = download_outcome(&ctx).await;
    assert!(outcome.contains("needs the cluster's secret"), "{outcome}");
    set_cluster(&ctx, &url, Some(&wrong)).await;
    let outcome = download_outcome(&ctx).await;
    assert!(
        outcome.contains("refused this client") && outcome.contains("differs"),
        "{outcome}"
    );
    assert!(!member.stderr().contains("Done with task"));
    // With it, the same download runs there.
    set_cluster(&ctx, &url, Some(&secret)).await;
    let outcome = download_outcome(&ctx).await;
    assert!(
        outcome.starts_with("ready: ") && outcome.ends_with(&format!("(ran on {url})")),
        "{outcome}"
    );
    assert!(member.stderr().contains("Done with task"));
}

/// TLS files for a cluster on 127.0.0.1, made with openssl: an authority,
/// and a certificate it signed for the address with its key.
fn tls_files() -> (PathBuf, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap().keep();
    let script = "set -e
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key \
            -out ca.pem -days 2 -subj /CN=icestage-test-authority
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout node.key \
            -out node.csr -subj /CN=127.0.0.1
        printf 'subjectAltName=IP:127.0.0.1\\nbasicConstraints=CA:FALSE\\nextendedKeyUsage=serverAuth\\n' > node.ext
        openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out node.pem \
            -days 2 -extfile node.ext";
    let made = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    (
        dir.join("ca.pem"),
        dir.join("node.pem"),
        dir.join("node.key"),
    )
}

#[test]
fn a_tls_cluster_speaks_only_tls_to_those_who_trust_its_authority() {
    on_cluster_stack(tls_cluster());
}

async fn tls_cluster() {
    use ballista_core::serde::protobuf::GetJobStatusParams;
    use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;

    let (ca, cert, key) = tls_files();
    let [ca, cert, key] = [&ca, &cert, &key].map(|p| p.to_str().unwrap().to_string());
    let tls = ["--tls-cert", &cert, "--tls-key", &key, "--tls-ca", &ca];
    let secret = secret_file("a-secret-the-cluster-shares");
    let secret_arg = secret.to_str().unwrap();
    let (address, _scheduler) = scheduler_with(&secret, &tls);
    // Its executor registers over TLS.
    let (_, member) = executor_with(&address, Some(&secret), &tls, &[]);
    member
        .wait_for("poll work loop", Duration::from_secs(60))
        .await;

    // A certificate without its key starts nothing.
    let mut half = Process::start(
        &[
            "scheduler",
            "--secret-file",
            secret_arg,
            "--tls-cert",
            &cert,
        ],
        &[],
    );
    half.fails_saying("needs its key", Duration::from_secs(30))
        .await;

    // A plain executor with the right secret cannot join.
    let mut plain = executor(&address, Some(&secret), &[]).1;
    plain.fails_saying("TLS", Duration::from_secs(90)).await;

    // A plain gRPC caller gets no answer at all.
    if let Ok(mut raw) = SchedulerGrpcClient::connect(format!("http://{address}")).await {
        let asked = raw
            .get_job_status(GetJobStatusParams {
                job_id: "x".to_string(),
            })
            .await
            .unwrap_err();
        assert_ne!(asked.code(), tonic::Code::Unauthenticated, "{asked}");
    }

    // A client with the secret but without the authority runs nothing;
    // with it, the download runs there.
    let warehouse = Warehouse::new();
    let ctx = warehouse.session().await;
    target(&ctx).await;
    let url = format!("df://{address}");
    set_cluster(&ctx, &url, Some(&secret)).await;
    let outcome = download_outcome(&ctx).await;
    assert!(
        !outcome.starts_with("ready: ") && outcome.contains("TLS"),
        "{outcome}"
    );
    run(&ctx, &format!("SET icestage.cluster_tls_ca_file = '{ca}'"))
        .await
        .unwrap();
    let outcome = download_outcome(&ctx).await;
    assert!(
        outcome.starts_with("ready: ") && outcome.ends_with(&format!("(ran on {url})")),
        "{outcome}"
    );
    assert!(member.stderr().contains("Done with task"));
}

#[test]
fn cluster_processes_stop_on_sigterm_even_when_their_scheduler_is_gone() {
    on_cluster_stack(stopped_by_sigterm());
}

async fn stopped_by_sigterm() {
    let terminate = |process: &Process| {
        // SAFETY: sends a signal to a child this test started.
        let sent = unsafe { libc::kill(process.child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(sent, 0);
    };
    let secret = secret_file("a-secret-the-cluster-shares");
    let (address, mut scheduler_process) = scheduler(&secret);
    let (_, mut member) = executor(&address, Some(&secret), &[]);
    member
        .wait_for("poll work loop", Duration::from_secs(60))
        .await;
    // The scheduler ends on SIGTERM; its executor, left polling nothing,
    // does too.
    terminate(&scheduler_process);
    let (status, stderr) = scheduler_process.ended(Duration::from_secs(10)).await;
    assert!(status.success() && stderr.contains("stopping"), "{stderr}");
    member
        .wait_for("poll work loop failed", Duration::from_secs(30))
        .await;
    // It ends either way: by icestage's handler ("icestage executor
    // stopping") or by Ballista's own, when that one sees the signal first.
    terminate(&member);
    let (status, stderr) = member.ended(Duration::from_secs(10)).await;
    assert!(
        status.success()
            && (stderr.contains("icestage executor stopping")
                || stderr.contains("Executor stopped")),
        "{stderr}"
    );
}
