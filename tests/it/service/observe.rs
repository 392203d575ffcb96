//! Watching the service: `GET /metrics` (Prometheus' text format) behind
//! its own token or on its own address, scraped after real work, and the
//! log lines (JSON here) that name each request and state change without
//! a secret in them.

use super::*;

const METRICS_TOKEN: &str = "sk_test_scraper";

/// The value of the sample `series` (name and labels, exactly as
/// written) in the text `scraped`; 0 when absent.
fn sample(scraped: &str, series: &str) -> f64 {
    scraped
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_logs_tell_what_the_service_did() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let config = write_config(
        &warehouse,
        &format!("metrics_token = \"{METRICS_TOKEN}\"\nlog_format = \"json\"\n"),
    );
    let service = Service::start(&config);
    design_client_promotes(&service, 7);
    let http = reqwest::Client::new();
    let metrics = format!("{}/metrics", service.url);
    // Unknown routes and bad tokens: one series each, whatever the path.
    for path in ["/nothing/here/1", "/nothing/here/2"] {
        http.get(format!("{}{path}", service.url))
            .send()
            .await
            .unwrap();
    }
    for bearer in [None, Some(TOKEN)] {
        let mut request = http.get(&metrics);
        if let Some(bearer) = bearer {
            request = request.bearer_auth(bearer);
        }
        assert_eq!(request.send().await.unwrap().status(), 401, "{bearer:?}");
    }
    let scraped = http
        .get(&metrics)
        .bearer_auth(METRICS_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(scraped.status(), 200);
    assert!(
        scraped.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    let scraped = scraped.text().await.unwrap();
    for (series, value) in [
        ("icestage_uploads_total{state=\"open\"}", 1.0),
        ("icestage_uploads_total{state=\"promoted\"}", 1.0),
        ("icestage_verified_rows_total", 7.0),
        (
            "icestage_http_requests_total{route=\"/uploads\",method=\"POST\",status=\"201\"}",
            1.0,
        ),
        (
            "icestage_http_requests_total{route=\"/uploads/{id}/complete\",method=\"POST\",status=\"202\"}",
            1.0,
        ),
        (
            "icestage_http_requests_total{route=\"unmatched\",method=\"GET\",status=\"404\"}",
            2.0,
        ),
        (
            "icestage_http_requests_total{route=\"/metrics\",method=\"GET\",status=\"401\"}",
            2.0,
        ),
        (
            "icestage_promotion_duration_seconds_count{outcome=\"promoted\"}",
            1.0,
        ),
    ] {
        assert_eq!(sample(&scraped, series), value, "{series} in:\n{scraped}");
    }
    assert!(
        sample(&scraped, "icestage_verified_bytes_total") > 0.0,
        "{scraped}"
    );
    assert!(
        sample(
            &scraped,
            "icestage_http_request_duration_seconds_count{route=\"/uploads\"}"
        ) >= 1.0,
        "{scraped}"
    );

    // The log: one JSON line per request, naming the caller; the state
    // changes; no secret anywhere.
    let lines = service.stderr.lock().unwrap().clone();
    let logged: Vec<Value> = lines
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let created = logged
        .iter()
        .find(|l| l["route"] == "/uploads" && l["method"] == "POST")
        .unwrap_or_else(|| panic!("a line for POST /uploads in {lines:#?}"));
    assert_eq!(
        (&created["status"], &created["caller"], &created["target"]),
        (&json!(201), &json!("acme"), &json!("icestage::request"))
    );
    assert!(
        created["request_id"]
            .as_str()
            .is_some_and(|id| !id.is_empty())
    );
    assert!(created["latency_ms"].is_number(), "{created}");
    assert!(
        logged
            .iter()
            .any(|l| l["target"] == "icestage::state" && l["state"] == "promoted"),
        "{lines:#?}"
    );
    for secret in [TOKEN, METRICS_TOKEN, "replicas-share-this"] {
        assert!(
            !lines.iter().any(|l| l.contains(secret)),
            "{secret} in the log: {lines:#?}"
        );
    }
}

/// `metrics_listen`: a second address with `/metrics` alone, no token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_listen_serves_the_metrics_alone() {
    let warehouse = Warehouse::new();
    let service = Service::start(&write_config(
        &warehouse,
        "metrics_listen = \"127.0.0.1:0\"\n",
    ));
    let said = service.stderr.lock().unwrap().clone();
    let url = said
        .iter()
        .find_map(|l| l.strip_prefix("icestage serve: metrics on "))
        .unwrap_or_else(|| panic!("the metrics address in {said:?}"))
        .to_string();
    let http = reqwest::Client::new();
    http.get(format!("{}/healthz", service.url))
        .send()
        .await
        .unwrap();
    let scraped = http.get(&url).send().await.unwrap();
    assert_eq!(scraped.status(), 200);
    let text = scraped.text().await.unwrap();
    assert!(
        text.contains("# TYPE icestage_http_requests_total counter"),
        "{text}"
    );
    let base = url.trim_end_matches("/metrics");
    let other = http.get(format!("{base}/uploads")).send().await.unwrap();
    assert_eq!(
        other.status(),
        404,
        "the metrics address serves nothing else"
    );
    // On the service's own address, without metrics_token: not there.
    let main = http
        .get(format!("{}/metrics", service.url))
        .send()
        .await
        .unwrap();
    assert_eq!(main.status(), 404);
}
