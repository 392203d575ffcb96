//! Webhooks: signed, retried, not repeated after a restart.

use super::*;

/// What a receiver saw.
#[derive(Default)]
pub(super) struct Received {
    pub(super) attempts: usize,
    /// (signature header, body) of each acknowledged delivery.
    pub(super) acknowledged: Vec<(String, String)>,
}

/// A webhook receiver that refuses the first `refuse` deliveries.
pub(super) async fn receiver(refuse: usize) -> (String, Arc<Mutex<Received>>) {
    let received = Arc::new(Mutex::new(Received::default()));
    let state = Arc::clone(&received);
    let app = axum::Router::new().route(
        "/hooks",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: String| {
            let state = Arc::clone(&state);
            async move {
                let mut received = state.lock().unwrap();
                received.attempts += 1;
                if received.attempts <= refuse {
                    return StatusCode::SERVICE_UNAVAILABLE;
                }
                let signature = headers["icestage-signature"].to_str().unwrap().to_string();
                received.acknowledged.push((signature, body));
                StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hooks", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, received)
}

fn verify(secret: &str, header: &str, body: &str) -> bool {
    use hmac::{Hmac, Mac};
    let parts: BTreeMap<&str, &str> = header
        .split(',')
        .filter_map(|p| p.split_once('='))
        .collect();
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{}.{body}", parts["t"]).as_bytes());
    hex::encode(mac.finalize().into_bytes()) == parts["v1"]
}

async fn upload_and_complete(
    http: &reqwest::Client,
    service: &Service,
    warehouse: &Warehouse,
    key: &str,
) -> String {
    let created: Value = post_json(
        http,
        format!("{}/uploads", service.url),
        json!({"table": "payments.transactions", "idempotency_key": key}),
    )
    .await;
    let id = text(&created, "upload_id");
    let client = warehouse.session().await;
    run(
        &client,
        &format!(
            "INSERT INTO {} VALUES ('{key}', 'a', 1, 'usd', TIMESTAMP '2026-07-01 00:00:00Z')",
            text(&created, "staging_table")
        ),
    )
    .await
    .unwrap();
    http.post(format!("{}/uploads/{id}/complete", service.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    id
}

/// Waits until the service has recorded `count` acknowledged deliveries (a
/// process killed between a receiver's 2xx and this record sends the event
/// again: at least once, and receivers deduplicate by the event's `id`).
async fn wait_recorded(warehouse: &Warehouse, count: usize) {
    let ctx = warehouse.session().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let recorded = run(
            &ctx,
            "SELECT count(*) AS n FROM icestage.webhook_deliveries",
        )
        .await
        .map(|b| crate::common::value(&b, "n"));
        if recorded.is_ok_and(|n| n.parse::<usize>().unwrap() >= count) {
            return;
        }
        assert!(Instant::now() < deadline, "the delivery was never recorded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_acknowledged(received: &Arc<Mutex<Received>>, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while received.lock().unwrap().acknowledged.len() < count {
        assert!(
            Instant::now() < deadline,
            "webhook deliveries never arrived"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_are_signed_retried_and_not_repeated_after_a_restart() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let (url, received) = receiver(2).await;
    let secret = "whsec_test";
    let path = write_config(
        &warehouse,
        &format!(
            "[service.webhook]\nurl = \"{url}\"\nsecret = \"{secret}\"\ninterval = \"300ms\"\n"
        ),
    );
    let http = reqwest::Client::new();
    let first = {
        let service = Service::start(&path);
        let id = upload_and_complete(&http, &service, &warehouse, "first").await;
        wait_acknowledged(&received, 1).await;
        wait_recorded(&warehouse, 1).await;
        id
    }; // killed here, after the delivery was acknowledged and recorded
    {
        let (signature, body) = received.lock().unwrap().acknowledged[0].clone();
        assert!(
            verify(secret, &signature, &body),
            "bad signature {signature}"
        );
        let event: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(event["type"], "upload.promoted");
        assert_eq!(event["data"]["upload_id"], first.as_str());
        assert!(
            received.lock().unwrap().attempts >= 3,
            "the first deliveries were refused and retried"
        );
    }
    // A new process: the acknowledged event is not sent again; new ones are.
    let service = Service::start(&path);
    let second = upload_and_complete(&http, &service, &warehouse, "second").await;
    let download: Value = post_json(
        &http,
        format!("{}/downloads", service.url),
        json!({"table": "payments.transactions", "limit": 1}),
    )
    .await;
    wait_acknowledged(&received, 3).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut events: Vec<(String, String)> = received
        .lock()
        .unwrap()
        .acknowledged
        .iter()
        .map(|(_, body)| {
            let event: Value = serde_json::from_str(body).unwrap();
            let data = &event["data"];
            let id = data["upload_id"]
                .as_str()
                .or(data["download_id"].as_str())
                .unwrap();
            (text(&event, "type"), id.to_string())
        })
        .collect();
    events.sort();
    let mut expected = vec![
        ("download.ready".to_string(), text(&download, "download_id")),
        ("upload.promoted".to_string(), first),
        ("upload.promoted".to_string(), second),
    ];
    expected.sort();
    assert_eq!(events, expected, "each event acknowledged exactly once");
}
