//! The bounded load test: 200 upload sessions at once.

use super::*;

#[derive(Default)]
struct Latencies(Mutex<BTreeMap<&'static str, Vec<Duration>>>);

impl Latencies {
    async fn time<T>(
        &self,
        endpoint: &'static str,
        work: impl std::future::Future<Output = T>,
    ) -> T {
        let start = Instant::now();
        let out = work.await;
        self.0
            .lock()
            .unwrap()
            .entry(endpoint)
            .or_default()
            .push(start.elapsed());
        out
    }

    fn report(&self) -> String {
        let mut lines = vec![format!(
            "{:<32} {:>6} {:>9} {:>9} {:>9}",
            "endpoint", "calls", "p50 ms", "p99 ms", "max ms"
        )];
        for (endpoint, samples) in self.0.lock().unwrap().iter_mut() {
            samples.sort();
            let at = |q: f64| {
                samples[((samples.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1000.0
            };
            lines.push(format!(
                "{endpoint:<32} {:>6} {:>9.1} {:>9.1} {:>9.1}",
                samples.len(),
                at(0.5),
                at(0.99),
                at(1.0)
            ));
        }
        lines.join("\n")
    }
}

/// One client of the load test: create, credentials, write a small batch
/// through the service's REST catalog (iceberg-rust's `RestCatalog` under
/// DataFusion), complete (twice, as a client that retries does), poll until
/// promoted.
async fn load_session(
    http: reqwest::Client,
    api: String,
    latencies: Arc<Latencies>,
    session: usize,
    rows: usize,
) {
    let send = |request: reqwest::RequestBuilder| async move {
        let response = request.bearer_auth(TOKEN).send().await.unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap();
        assert!(status.is_success(), "session {session}: {status} {body}");
        body
    };
    let created = latencies
        .time(
            "POST /uploads",
            send(http.post(format!("{api}/uploads")).json(&json!({
                "table": "payments.transactions",
                "idempotency_key": format!("load-{session}"),
            }))),
        )
        .await;
    let id = text(&created, "upload_id");
    let credentials = latencies
        .time(
            "POST /uploads/{id}/credentials",
            send(http.post(format!("{api}/uploads/{id}/credentials"))),
        )
        .await;
    let insert = insert_rows(
        &text(&created, "staging_table"),
        &format!("s{session}-r"),
        &format!("a{session}"),
        rows,
    );
    latencies
        .time("client append via REST catalog", async {
            let (_, writer) = rest_session(&credentials).await;
            writer.sql(&insert).await.unwrap().collect().await.unwrap()
        })
        .await;
    for _ in 0..2 {
        latencies
            .time(
                "POST /uploads/{id}/complete",
                send(http.post(format!("{api}/uploads/{id}/complete"))),
            )
            .await;
    }
    let completed = Instant::now();
    let deadline = completed + Duration::from_secs(600);
    let mut pause = Duration::from_millis(200);
    loop {
        let status = latencies
            .time(
                "GET /uploads/{id}",
                send(http.get(format!("{api}/uploads/{id}"))),
            )
            .await;
        match text(&status, "state").as_str() {
            "promoted" => break,
            // Claimed before complete's 202: never `open` again.
            "promoting" => assert!(
                Instant::now() < deadline,
                "session {session} never promoted: {status}"
            ),
            _ => panic!("session {session}: {status}"),
        }
        // Back off as a polling client should: 200 ms, growing to 2 s.
        tokio::time::sleep(pause).await;
        pause = (pause * 3 / 2).min(Duration::from_secs(2));
    }
    latencies
        .0
        .lock()
        .unwrap()
        .entry("complete -> promoted seen")
        .or_default()
        .push(completed.elapsed());
}

/// The bounded load test: 200 upload sessions at once into one target
/// through the API on a real socket; every batch lands exactly once. Prints
/// throughput and per-endpoint latency (`--nocapture` shows them); nothing
/// here asserts a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_upload_sessions_land_exactly_once() {
    two_hundred_sessions(Warehouse::new()).await;
}

/// The same load on a PostgreSQL catalog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_upload_sessions_land_exactly_once_on_postgres() {
    two_hundred_sessions(Warehouse::postgres().await).await;
}

async fn two_hundred_sessions(warehouse: Warehouse) {
    const SESSIONS: usize = 200;
    const ROWS: usize = 10;
    target(&warehouse).await;
    let path = warehouse.path().join("service.toml");
    let text_config = config(&warehouse, "").replace(
        "requests_per_minute = 10000",
        "requests_per_minute = 1000000",
    );
    std::fs::write(&path, text_config).unwrap();
    let service = Service::start(&path);
    let http = reqwest::Client::new();
    let latencies = Arc::new(Latencies::default());
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for session in 0..SESSIONS {
        let (http, api, latencies) = (http.clone(), service.url.clone(), Arc::clone(&latencies));
        clients.spawn(load_session(http, api, latencies, session, ROWS));
    }
    while let Some(done) = clients.join_next().await {
        done.unwrap();
    }
    let elapsed = started.elapsed();

    let check = warehouse.session().await;
    let landed = "SELECT count(*) || ' rows, ' || count(DISTINCT transaction_id) || ' distinct, ' || \
                  count(DISTINCT account_id) || ' sessions' FROM payments.transactions";
    assert_eq!(
        scalar(&check, landed).await,
        format!(
            "{} rows, {} distinct, {SESSIONS} sessions",
            SESSIONS * ROWS,
            SESSIONS * ROWS
        )
    );
    let appends = "SELECT count(*) FROM payments.transactions$snapshots WHERE operation = 'append'";
    assert_eq!(
        scalar(&check, appends).await,
        SESSIONS.to_string(),
        "one append per upload"
    );
    println!(
        "{SESSIONS} upload sessions of {ROWS} rows, all at once: {:.1}s, {:.1} uploads/s\n{}",
        elapsed.as_secs_f64(),
        SESSIONS as f64 / elapsed.as_secs_f64(),
        latencies.report()
    );
}
