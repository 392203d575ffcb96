//! Webhooks: events (`upload.promoted`, `upload.failed`, `download.ready`,
//! `download.failed`) derived from the catalog, POSTed to the configured URL
//! and signed as Stripe signs its webhooks: header
//! `Icestage-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
//!
//! Events come from the sessions' state in the catalog, not from memory, and
//! each acknowledged (2xx) delivery is recorded in the catalog table
//! `icestage.webhook_deliveries`: a restarted service (or another replica)
//! delivers what was not acknowledged and nothing that was, at least once.
//! Failed deliveries are retried with exponential backoff (up to 5 minutes).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use chrono::Utc;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use super::{AppState, WebhookSettings, json_rows};
use crate::config::parse_duration;

/// The signature header's name.
pub const SIGNATURE_HEADER: &str = "Icestage-Signature";

/// `t=<timestamp>,v1=<signature>` for `body` sent at `timestamp`.
pub fn signature(secret: &str, timestamp: i64, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(format!("{timestamp}.{body}").as_bytes());
    format!(
        "t={timestamp},v1={}",
        hex::encode(mac.finalize().into_bytes())
    )
}

struct Event {
    id: String,
    kind: String,
    data: serde_json::Map<String, Value>,
}

/// Events of sessions the service created (they have an owner).
async fn events(state: &AppState) -> Vec<Event> {
    let mut out = vec![];
    for (kind, sql, id_column) in [
        (
            "upload",
            "SELECT * FROM uploads() WHERE owner IS NOT NULL AND state IN ('promoted', 'failed')",
            "upload_id",
        ),
        (
            "download",
            "SELECT * FROM downloads() WHERE owner IS NOT NULL AND state IN ('ready', 'failed')",
            "download_id",
        ),
    ] {
        let Ok(batches) = state.run(sql).await else {
            continue;
        };
        for row in json_rows(&batches) {
            let id = row
                .get(id_column)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string();
            let session_state = row
                .get("state")
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string();
            out.push(Event {
                id: format!("{kind}.{session_state}:{id}"),
                kind: format!("{kind}.{session_state}"),
                data: row,
            });
        }
    }
    out
}

async fn delivered(state: &AppState) -> HashSet<String> {
    let Ok(batches) = state
        .run("SELECT event_id FROM icestage.webhook_deliveries")
        .await
    else {
        return HashSet::new();
    };
    json_rows(&batches)
        .into_iter()
        .filter_map(|row| {
            row.get("event_id")
                .and_then(|v| v.as_str())
                .map(str::to_string)
        })
        .collect()
}

/// Runs for as long as the service does.
pub(crate) async fn dispatch(state: AppState, webhook: WebhookSettings) {
    let interval = parse_duration(&webhook.interval).unwrap_or(Duration::from_secs(2));
    let _ = state.run("CREATE NAMESPACE IF NOT EXISTS icestage").await;
    let _ = state
        .run(
            "CREATE TABLE IF NOT EXISTS icestage.webhook_deliveries (event_id VARCHAR NOT NULL, \
             delivered_at TIMESTAMP WITH TIME ZONE NOT NULL, status INT NOT NULL)",
        )
        .await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("an HTTP client");
    let mut retry: HashMap<String, (u32, Instant)> = HashMap::new();
    loop {
        tokio::time::sleep(interval).await;
        let done = delivered(&state).await;
        let mut acknowledged = vec![];
        for event in events(&state).await {
            if done.contains(&event.id)
                || retry
                    .get(&event.id)
                    .is_some_and(|(_, next)| Instant::now() < *next)
            {
                continue;
            }
            let body = json!({
                "id": event.id,
                "type": event.kind,
                "created": Utc::now().to_rfc3339(),
                "data": event.data,
            })
            .to_string();
            let timestamp = Utc::now().timestamp();
            let sent = client
                .post(&webhook.url)
                .header("content-type", "application/json")
                .header(
                    SIGNATURE_HEADER,
                    signature(webhook.secret.expose(), timestamp, &body),
                )
                .body(body)
                .send()
                .await;
            match sent {
                Ok(response) if response.status().is_success() => {
                    retry.remove(&event.id);
                    acknowledged.push((event.id, response.status().as_u16()));
                }
                _ => {
                    let attempts = retry.get(&event.id).map_or(0, |(a, _)| *a) + 1;
                    let wait = Duration::from_secs(2u64.saturating_pow(attempts).min(300));
                    retry.insert(event.id, (attempts, Instant::now() + wait));
                }
            }
        }
        if !acknowledged.is_empty() {
            let now = Utc::now().to_rfc3339();
            let rows: Vec<String> = acknowledged
                .iter()
                .map(|(id, status)| {
                    format!(
                        "('{}', TIMESTAMP '{now}', {status})",
                        id.replace('\'', "''")
                    )
                })
                .collect();
            let _ = state
                .run(&format!(
                    "INSERT INTO icestage.webhook_deliveries VALUES {}",
                    rows.join(", ")
                ))
                .await;
        }
    }
}
