//! The soak: clients uploading, completing, aborting, leaving uploads to
//! expire and reading downloads through two `icestage serve` replicas on
//! one catalog, while replicas are SIGKILLed at random and started again;
//! then every promoted upload's rows must be in the target exactly once and
//! nothing else. The suite runs it for 20 s; `./scripts/soak.sh` for 10
//! minutes (`ICESTAGE_SOAK_SECS`).

use std::collections::HashMap;

use super::*;

/// What a client did with one upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Intent {
    /// Completed (or asked to): must end promoted.
    Promote,
    /// Aborted (or asked to): must end with no rows in the target.
    Abort,
    /// Left alone with a short ttl: expires, no rows.
    Leave,
}

#[derive(Default)]
struct Ledger {
    /// Upload id → (rows written, what was meant).
    uploads: HashMap<String, (usize, Intent)>,
    downloads_ready: usize,
    kills: usize,
    errors: usize,
}

struct Replicas {
    config: std::path::PathBuf,
    live: Vec<Service>,
}

impl Replicas {
    fn urls(&self) -> Vec<String> {
        self.live.iter().map(|s| s.url.clone()).collect()
    }
}

fn pick(urls: &[String]) -> String {
    urls[rand::random::<u64>() as usize % urls.len()].clone()
}

/// One client's operations until `deadline`; errors from killed replicas
/// are counted and the operation moves on.
async fn client(
    n: usize,
    replicas: Arc<Mutex<Replicas>>,
    ledger: Arc<Mutex<Ledger>>,
    deadline: Instant,
    ttl: String,
) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut round = 0usize;
    while Instant::now() < deadline {
        round += 1;
        let api = pick(&replicas.lock().unwrap().urls());
        let roll = rand::random::<u64>() % 10;
        let outcome = if roll < 2 {
            download(&http, &api).await.map(|ready| {
                if ready {
                    ledger.lock().unwrap().downloads_ready += 1;
                }
            })
        } else {
            let intent = match roll {
                2 => Intent::Leave,
                3 | 4 => Intent::Abort,
                _ => Intent::Promote,
            };
            upload(&http, &replicas, &api, n, round, intent, &ledger, &ttl).await
        };
        if outcome.is_err() {
            ledger.lock().unwrap().errors += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

type Outcome<T> = std::result::Result<T, String>;

async fn send(request: reqwest::RequestBuilder) -> Outcome<Value> {
    let response = request
        .bearer_auth(TOKEN)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if status.is_success() {
        Ok(body)
    } else {
        Err(format!("{status} {body}"))
    }
}

#[allow(clippy::too_many_arguments)]
async fn upload(
    http: &reqwest::Client,
    replicas: &Mutex<Replicas>,
    api: &str,
    client: usize,
    round: usize,
    intent: Intent,
    ledger: &Mutex<Ledger>,
    ttl: &str,
) -> Outcome<()> {
    let ttl = if intent == Intent::Leave { "2s" } else { ttl };
    let created = send(http.post(format!("{api}/uploads")).json(&json!({
        "table": "payments.transactions",
        "ttl": ttl,
        "idempotency_key": format!("soak-{client}-{round}"),
    })))
    .await?;
    let id = text(&created, "upload_id");
    let rows = 1 + rand::random::<u64>() as usize % 4;
    let insert = insert_rows(
        &text(&created, "staging_table"),
        &format!("{id}-"),
        &format!("c{client}"),
        rows,
    );
    // A write that fails (its replica was killed) leaves an upload that
    // is aborted: its rows must never reach the target either way.
    let written = match try_rest_session(&created).await {
        Ok((_, writer)) => match writer.sql(&insert).await {
            Ok(frame) => frame.collect().await.is_ok(),
            Err(_) => false,
        },
        Err(_) => false,
    };
    let intent = if written { intent } else { Intent::Abort };
    ledger
        .lock()
        .unwrap()
        .uploads
        .insert(id.clone(), (if written { rows } else { 0 }, intent));
    // As a client would: a complete or an abort that fails (its replica
    // was killed) is sent again, to any replica.
    let mut last = Ok(());
    for _ in 0..5 {
        let api = pick(&replicas.lock().unwrap().urls());
        last = match intent {
            Intent::Promote => send(http.post(format!("{api}/uploads/{id}/complete")))
                .await
                .map(|_| ()),
            Intent::Abort => send(http.delete(format!("{api}/uploads/{id}")))
                .await
                .map(|_| ()),
            Intent::Leave => Ok(()),
        };
        if last.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    last
}

/// A download of the target's USD rows; whether it was ready within 10 s.
async fn download(http: &reqwest::Client, api: &str) -> Outcome<bool> {
    let created = send(http.post(format!("{api}/downloads")).json(&json!({
        "table": "payments.transactions",
        "filter": [{"column": "currency", "op": "eq", "value": "usd"}],
    })))
    .await?;
    let id = text(&created, "download_id");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let status = send(http.get(format!("{api}/downloads/{id}"))).await?;
        match text(&status, "state").as_str() {
            "ready" => return Ok(true),
            "failed" => return Err(format!("download failed: {status}")),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    Ok(false)
}

/// Kills a random replica every 2–5 s and starts another, until `deadline`.
async fn killer(replicas: Arc<Mutex<Replicas>>, ledger: Arc<Mutex<Ledger>>, deadline: Instant) {
    while Instant::now() < deadline {
        let pause = 2000 + rand::random::<u64>() % 3000;
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let config = replicas.lock().unwrap().config.clone();
        let fresh = tokio::task::spawn_blocking(move || Service::start(&config))
            .await
            .unwrap();
        let victim = {
            let mut replicas = replicas.lock().unwrap();
            let at = rand::random::<u64>() as usize % replicas.live.len();
            replicas.live.push(fresh);
            replicas.live.swap_remove(at)
        };
        victim.kill();
        ledger.lock().unwrap().kills += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_with_killed_replicas_loses_and_doubles_nothing() {
    soak(Warehouse::new()).await;
}

/// The same soak, the replicas sharing a PostgreSQL catalog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_with_killed_replicas_on_postgres_loses_and_doubles_nothing() {
    soak(Warehouse::postgres().await).await;
}

async fn soak(warehouse: Warehouse) {
    let seconds: u64 = std::env::var("ICESTAGE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let clients: usize = std::env::var("ICESTAGE_SOAK_CLIENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    target(&warehouse).await;
    let config = write_config(&warehouse, "promotion_lease = \"3s\"\nrun_pipes = false\n");
    let replicas = Arc::new(Mutex::new(Replicas {
        live: vec![Service::start(&config), Service::start(&config)],
        config: config.clone(),
    }));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let mut tasks = vec![tokio::spawn(killer(
        Arc::clone(&replicas),
        Arc::clone(&ledger),
        deadline,
    ))];
    // Long enough to outlast the soak: expiry is tested by the uploads left
    // alone, not by the ones completed.
    let ttl = format!("{}s", seconds + 600);
    for n in 0..clients {
        tasks.push(tokio::spawn(client(
            n,
            Arc::clone(&replicas),
            Arc::clone(&ledger),
            deadline,
            ttl.clone(),
        )));
    }
    for task in tasks {
        task.await.unwrap();
    }

    // Settle: no more kills. Every upload meant for promotion is completed
    // again until it is promoted (a killed replica's promotion is taken
    // over once its claim lapses); every abort is repeated; then what was
    // left expires.
    let http = reqwest::Client::new();
    let api = replicas.lock().unwrap().urls()[0].clone();
    let uploads = ledger.lock().unwrap().uploads.clone();
    let mut failed = vec![];
    for (id, (rows, intent)) in &uploads {
        match intent {
            Intent::Promote => {
                // Each upload gets its own time to settle: a killed
                // replica's claim lapses, and a complete starts over.
                let settle = Instant::now() + Duration::from_secs(120);
                loop {
                    let status = send(http.get(format!("{api}/uploads/{id}"))).await.unwrap();
                    match text(&status, "state").as_str() {
                        "promoted" => {
                            assert_eq!(status["rows"].as_u64(), Some(*rows as u64), "{status}");
                            break;
                        }
                        "failed" => {
                            failed.push(status);
                            break;
                        }
                        _ => {
                            assert!(Instant::now() < settle, "{id} never settled: {status}");
                            let _ = send(http.post(format!("{api}/uploads/{id}/complete"))).await;
                            tokio::time::sleep(Duration::from_millis(300)).await;
                        }
                    }
                }
            }
            Intent::Abort => {
                let _ = send(http.delete(format!("{api}/uploads/{id}"))).await;
            }
            Intent::Leave => {}
        }
    }
    assert!(failed.is_empty(), "uploads that failed: {failed:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ctx = warehouse.session().await;
    run(&ctx, "EXPIRE STAGING").await.unwrap();

    // The target holds every promoted upload's rows once, and nothing else.
    let batches = run(
        &ctx,
        "SELECT split_part(transaction_id, '-', 1) AS upload, count(*) AS rows, \
         count(DISTINCT transaction_id) AS distinct_rows FROM payments.transactions GROUP BY 1",
    )
    .await
    .unwrap();
    let mut landed: HashMap<String, (i64, i64)> = HashMap::new();
    for batch in &batches {
        use datafusion::arrow::array::AsArray;
        use datafusion::arrow::compute::cast;
        use datafusion::arrow::datatypes::{DataType, Int64Type};
        let ids: Vec<String> = cast(batch.column(0), &DataType::Utf8)
            .unwrap()
            .as_string::<i32>()
            .iter()
            .map(|v| v.unwrap_or_default().to_string())
            .collect();
        let counts = |c: usize| {
            cast(batch.column(c), &DataType::Int64)
                .unwrap()
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        };
        for ((id, rows), distinct) in ids.into_iter().zip(counts(1)).zip(counts(2)) {
            landed.insert(id, (rows, distinct));
        }
    }
    let mut lost = 0;
    let mut doubled = 0;
    let mut stray = 0;
    let mut promoted = 0;
    for (id, (rows, intent)) in &uploads {
        let (got, distinct) = landed.remove(id).unwrap_or((0, 0));
        match intent {
            Intent::Promote => {
                promoted += 1;
                lost += (*rows as i64 - distinct).max(0);
                doubled += got - distinct;
            }
            _ => stray += got,
        }
    }
    stray += landed.values().map(|(rows, _)| rows).sum::<i64>();
    let ledger = ledger.lock().unwrap();
    let rows: usize = uploads
        .values()
        .filter(|(_, i)| *i == Intent::Promote)
        .map(|(r, _)| r)
        .sum();
    eprintln!(
        "soak {seconds}s, {clients} clients, 2 replicas: {} uploads ({promoted} promoted, {} aborted, {} left to expire), \
         {} downloads ready, {} replicas killed, {} client errors from kills; {rows} rows checked: \
         {lost} lost, {doubled} doubled, {stray} that should not be there",
        uploads.len(),
        uploads
            .values()
            .filter(|(_, i)| *i == Intent::Abort)
            .count(),
        uploads
            .values()
            .filter(|(_, i)| *i == Intent::Leave)
            .count(),
        ledger.downloads_ready,
        ledger.kills,
        ledger.errors,
    );
    assert_eq!((lost, doubled, stray), (0, 0, 0));
    assert!(promoted > 0 && ledger.kills > 0);
}
