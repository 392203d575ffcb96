//! Webhooks: events (`upload.promoted`, `upload.failed`, `download.ready`,
//! `download.failed`, `pipe.loaded`, `pipe.failed`) derived from the catalog, POSTed to the configured URL
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

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use iceberg::table::Table;
use iceberg::{NamespaceIdent, TableIdent};
use serde_json::{Value, json};
use sha2::Sha256;

use super::{AppState, WebhookSettings, json_of};
use crate::catalog::bridge::insert::append_stored;
use crate::catalog::manifests::lookup::Wanted;
use crate::config::parse_duration;
use crate::download::DownloadState;
use crate::rows::{StoredRow, result_row};
use crate::session::log::ICESTAGE_NAMESPACE;
use crate::upload::UploadState;

/// How far back each round reads the logs before the previous round's
/// start: records committed late (a log append takes well under a second),
/// or by a replica whose clock is behind (NTP keeps it within a second).
const CURSOR_OVERLAP: chrono::Duration = chrono::Duration::seconds(60);
/// How long an event is retried before it is given up.
const GIVE_UP: Duration = Duration::from_secs(24 * 3600);

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

/// The events of sessions the service created (they have an owner) that
/// reached a state a webhook reports: those still live, and those whose
/// end was recorded since `since` (older log files are not read).
async fn events(state: &AppState, since: DateTime<Utc>) -> crate::error::Result<Vec<Event>> {
    let mut out = vec![];
    let uploads = state.ops().uploads_since(since).await?;
    let uploads: Vec<_> = uploads
        .into_iter()
        .filter(|u| {
            u.owner.is_some() && matches!(u.state, UploadState::Promoted | UploadState::Failed)
        })
        .collect();
    let downloads = state.ops().downloads_since(since).await?;
    let downloads: Vec<_> = downloads
        .into_iter()
        .filter(|d| {
            d.owner.is_some() && matches!(d.state, DownloadState::Ready | DownloadState::Failed)
        })
        .collect();
    let runs = state.ops().pipe_runs_since(since).await?;
    for (run, row) in runs.iter().zip(json_of(&runs)?) {
        for (kind, happened) in [
            ("pipe.loaded", run.files_loaded > 0),
            (
                "pipe.failed",
                run.files_failed > 0 || run.snapshot_id.is_none() && run.files_loaded == 0,
            ),
        ] {
            if happened {
                out.push(Event {
                    id: format!("{kind}:{}:{}", run.pipe, run.run_id),
                    kind: kind.to_string(),
                    data: row.clone(),
                });
            }
        }
    }
    for (kind, rows, id_column) in [
        ("upload", json_of(&uploads)?, "upload_id"),
        ("download", json_of(&downloads)?, "download_id"),
    ] {
        for row in rows {
            let field = |name: &str| {
                row.get(name)
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_string()
            };
            let (id, session_state) = (field(id_column), field("state"));
            out.push(Event {
                id: format!("{kind}.{session_state}:{id}"),
                kind: format!("{kind}.{session_state}"),
                data: row,
            });
        }
    }
    Ok(out)
}

/// The table of acknowledged deliveries, in the default catalog.
fn deliveries_ident() -> TableIdent {
    TableIdent::new(
        NamespaceIdent::new(ICESTAGE_NAMESPACE.to_string()),
        "webhook_deliveries".to_string(),
    )
}

result_row! {
    /// One acknowledged delivery: a row of `icestage.webhook_deliveries`.
    #[derive(Debug, Clone, PartialEq)]
    pub struct DeliveryRow {
        /// The event delivered.
        pub event_id: String,
        /// When the receiver acknowledged it.
        pub delivered_at: DateTime<Utc>,
        /// The HTTP status it answered.
        pub status: i32,
    }
}

async fn deliveries(state: &AppState) -> crate::error::Result<Table> {
    let catalog = state.0.icestage.default_catalog();
    catalog
        .ensure_namespace(&NamespaceIdent::new(ICESTAGE_NAMESPACE.to_string()))
        .await?;
    catalog
        .table_or_create(&deliveries_ident(), DeliveryRow::iceberg_schema)
        .await
}

/// The ids of the events delivered and acknowledged (since `since`, when
/// given: older files of the record are not read).
async fn delivered(
    state: &AppState,
    since: Option<DateTime<Utc>>,
) -> crate::error::Result<HashSet<String>> {
    let table = deliveries(state).await?;
    // Since a time: the files that may hold deliveries since, from
    // manifests decoded once (an earlier one read with them is as
    // acknowledged).
    let wanted = since
        .and_then(|since| Wanted::since(table.metadata().current_schema(), "delivered_at", since));
    let batches = state
        .0
        .icestage
        .default_catalog()
        .manifests()
        .read(&table, wanted)
        .await?;
    let name = deliveries_ident().to_string();
    let mut ids = HashSet::new();
    for batch in &batches {
        ids.extend(
            DeliveryRow::from_batch(&name, batch)?
                .into_iter()
                .map(|row| row.event_id),
        );
    }
    Ok(ids)
}

/// Records acknowledged deliveries: (event id, HTTP status).
async fn record(state: &AppState, acknowledged: &[(String, u16)]) -> crate::error::Result<()> {
    let table = deliveries(state).await?;
    let now = Utc::now();
    let rows: Vec<DeliveryRow> = acknowledged
        .iter()
        .map(|(id, status)| DeliveryRow {
            event_id: id.clone(),
            delivered_at: now,
            status: i32::from(*status),
        })
        .collect();
    append_stored(state.0.icestage.default_catalog(), &table, &rows).await
}

/// Runs for as long as the service does.
pub(crate) async fn dispatch(state: AppState, webhook: WebhookSettings) {
    let interval = parse_duration(&webhook.interval).unwrap_or(Duration::from_secs(2));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("an HTTP client");
    let mut retry: HashMap<String, (u32, Instant)> = HashMap::new();
    // A cursor, not a re-read: every acknowledged id (the record read in
    // full once, then only what was added since the last round), the events
    // seen and not yet acknowledged, and the time from which the logs are
    // read (a day back at the start, as a restarted dispatcher gives up on
    // older events; then the last round's start less an overlap for records
    // committed late or by a replica whose clock is behind).
    let mut done: Option<HashSet<String>> = None;
    let mut pending: HashMap<String, (Event, Instant)> = HashMap::new();
    let mut since = Utc::now() - chrono::Duration::days(1);
    loop {
        tokio::time::sleep(interval).await;
        let round = Utc::now();
        // Without the record of what was delivered, deliver nothing: the
        // catalog comes back, or the service is stopped.
        let Ok(fresh) = delivered(&state, done.as_ref().map(|_| since)).await else {
            continue;
        };
        let done = done.get_or_insert_with(HashSet::new);
        done.extend(fresh);
        // A failed read leaves the cursor where it was.
        let Ok(found) = events(&state, since).await else {
            continue;
        };
        since = round - CURSOR_OVERLAP;
        for event in found {
            if !done.contains(&event.id) {
                pending
                    .entry(event.id.clone())
                    .or_insert((event, Instant::now()));
            }
        }
        pending.retain(|id, (_, first)| !done.contains(id) && first.elapsed() < GIVE_UP);
        let mut acknowledged = vec![];
        for (event, _) in pending.values() {
            if retry
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
                    acknowledged.push((event.id.clone(), response.status().as_u16()));
                }
                _ => {
                    crate::metrics::count(
                        "icestage_webhook_delivery_failures_total",
                        "Webhook deliveries that failed (each is tried again with backoff).",
                        &[("type", event.kind.as_str())],
                        1.0,
                    );
                    let attempts = retry.get(&event.id).map_or(0, |(a, _)| *a) + 1;
                    let wait = Duration::from_secs(2u64.saturating_pow(attempts).min(300));
                    retry.insert(event.id.clone(), (attempts, Instant::now() + wait));
                }
            }
        }
        for (id, _) in &acknowledged {
            pending.remove(id);
            done.insert(id.clone());
        }
        if !acknowledged.is_empty() {
            // Not recorded (the catalog failed): delivered again next time,
            // at least once.
            let _ = record(&state, &acknowledged).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DeliveryRow;

    /// The deliveries table keeps the schema earlier versions created.
    #[test]
    fn deliveries_keep_their_schema() {
        assert_eq!(
            crate::rows::stored_shape::<DeliveryRow>(),
            [
                "1 event_id string required",
                "2 delivered_at timestamptz required",
                "3 status int required",
            ]
        );
    }
}
