//! `icestage serve`: the router in-process (tower's `oneshot`), real
//! service processes on real sockets (two replicas on one catalog, a
//! restart, SIGTERM), webhooks, the source design's Python client, and a
//! bounded load test. This file holds what they share.

mod files;
mod load;
mod oauth;
mod observe;
mod pipes;
mod processes;
mod red_team;
mod rest_backend;
mod router;
mod signing;
mod soak;
mod tenants;
mod webhooks;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use icestage::service::{AppState, ServiceConfig, router};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::aws::Moto;
use crate::common::{Warehouse, python_script, run, scalar};

const TOKEN: &str = "sk_test_acme";
const OTHER: &str = "sk_test_other";

fn config(warehouse: &Warehouse, extra: &str) -> String {
    format!(
        r#"
{}
[service]
listen = "127.0.0.1:0"
id_secret = "replicas-share-this"
requests_per_minute = 10000
{extra}
[[service.tokens]]
name = "acme"
token = "{TOKEN}"
tables = ["payments.transactions", "payments.missing"]
operations = ["upload", "download"]
[[service.tokens]]
name = "other"
token = "{OTHER}"
tables = ["payments.transactions"]
operations = ["download"]
"#,
        warehouse.catalog_toml()
    )
}

/// Creates the target table `payments.transactions` in the embedded warehouse.
async fn target(warehouse: &Warehouse) {
    create_target(&warehouse.session().await).await;
}

async fn create_target(ctx: &datafusion::prelude::SessionContext) {
    run(ctx, "CREATE SCHEMA payments").await.unwrap();
    run(
        ctx,
        "CREATE TABLE payments.transactions (transaction_id VARCHAR NOT NULL, account_id VARCHAR NOT NULL, \
         amount_cents BIGINT NOT NULL, currency VARCHAR NOT NULL, created_at TIMESTAMP WITH TIME ZONE NOT NULL)",
    )
    .await
    .unwrap();
}

/// Runs the design's client (tests/python/api_client.py) against `service`
/// and checks that its `rows` were promoted.
fn design_client_promotes(service: &Service, rows: usize) {
    let out = python_script(
        "api_client.py",
        &[
            &service.url,
            TOKEN,
            "payments.transactions",
            &rows.to_string(),
        ],
    );
    let status: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (text(&status, "state"), status["rows"].as_u64()),
        ("promoted".into(), Some(rows as u64)),
        "{status}"
    );
}

/// Sends one request through the router; returns status and JSON body.
/// The service's router for a config given as TOML text.
async fn app(config_text: &str) -> axum::Router {
    let config = ServiceConfig::from_toml_str(config_text).unwrap();
    router(AppState::new(config).await.unwrap())
}

/// [`call`] with the token of `acme` and no body.
async fn call_as_acme(app: &axum::Router, method: &str, path: &str) -> (StatusCode, Value) {
    call(app, method, path, Some(TOKEN), None).await
}

async fn call(
    app: &axum::Router,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    if body.is_some() {
        request = request.header("content-type", "application/json");
    }
    let request = request
        .body(Body::from(body.unwrap_or_default().to_string()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 24)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn text(value: &Value, key: &str) -> String {
    value[key].as_str().unwrap_or_default().to_string()
}

/// Calls `get` every 100 ms until the `state` it answers is one of `states`.
async fn poll<F: std::future::Future<Output = Value>>(
    what: &str,
    states: &[&str],
    mut get: impl FnMut() -> F,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let body = get().await;
        if states.contains(&text(&body, "state").as_str()) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never reached {states:?}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn poll_until(app: &axum::Router, path: &str, states: &[&str]) -> Value {
    poll(path, states, || async {
        let (status, body) = call(app, "GET", path, Some(TOKEN), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    })
    .await
}

struct Service {
    child: Child,
    url: String,
    /// What the service printed on stderr (but where it listens).
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Service {
    fn start(config_path: &std::path::Path) -> Self {
        Self::start_with(config_path, &[])
    }

    /// [`Service::start_with`] held at `failpoint` until the file `resume`
    /// is written, with the environment variables `env` besides.
    fn start_held(
        config_path: &std::path::Path,
        failpoint: &str,
        resume: &std::path::Path,
        env: &[(&str, &str)],
    ) -> Self {
        let held = [
            ("ICESTAGE_FAILPOINT", failpoint),
            ("ICESTAGE_FAILPOINT_RESUME", resume.to_str().unwrap()),
        ];
        Self::start_with(config_path, &[&held[..], env].concat())
    }

    /// [`Service::start`] with environment variables (a failpoint).
    fn start_with(config_path: &std::path::Path, env: &[(&str, &str)]) -> Self {
        let binary =
            std::env::var_os("ICESTAGE_SERVE_BIN").unwrap_or(env!("CARGO_BIN_EXE_icestage").into());
        let mut child = Command::new(binary)
            .args(["serve", "--config", config_path.to_str().unwrap()])
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut said = vec![];
        let url = loop {
            let line = lines
                .next()
                .expect("the service prints where it listens")
                .unwrap();
            if let Some(url) = line.strip_prefix("icestage serve: listening on ") {
                break url.to_string();
            }
            said.push(line);
        };
        // Keep draining stderr so the service never blocks on it.
        let stderr = Arc::new(Mutex::new(said));
        let kept = Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in lines.map_while(std::result::Result::ok) {
                kept.lock().unwrap().push(line);
            }
        });
        Self { child, url, stderr }
    }

    /// Waits up to a minute for the process to say it reached `failpoint`
    /// (where `ICESTAGE_FAILPOINT` holds it).
    fn reached_failpoint(&self, failpoint: &str) -> bool {
        let needle = format!("failpoint {failpoint} reached");
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self
                .stderr
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains(&needle))
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `request` with the test token; the JSON answer.
async fn json_answer(request: reqwest::RequestBuilder) -> Value {
    request
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// POSTs `body` with the test token; the JSON answer.
async fn post_json(http: &reqwest::Client, url: String, body: Value) -> Value {
    json_answer(http.post(url).json(&body)).await
}

/// A `[[catalogs]]` entry `lake`: a SQL catalog in `dir` whose warehouse
/// is `s3://lake/wh` on the emulator at `endpoint`, reached as `identity`
/// says (TOML lines of `[catalogs.config]`: keys, a role to vend with).
fn s3_catalog_toml(dir: &std::path::Path, endpoint: &str, identity: &str) -> String {
    format!(
        r#"
[[catalogs]]
name = "lake"
type = "sql"
[catalogs.config]
uri = "sqlite:{dir}/catalog.db?mode=rwc"
warehouse = "s3://lake/wh"
region = "us-east-1"
"s3.endpoint" = "{endpoint}"
{identity}
"#,
        dir = dir.display()
    )
}

fn write_config(warehouse: &Warehouse, extra: &str) -> std::path::PathBuf {
    let path = warehouse.path().join("service.toml");
    std::fs::write(&path, config(warehouse, extra)).unwrap();
    path
}

/// `POST /uploads/{id}/complete` on the service at `api`, accepted.
async fn complete(http: &reqwest::Client, api: &str, id: &str) {
    complete_with(http, api, id, None).await;
}

/// [`complete`] with `body` (the options the promotion lands with).
async fn complete_with(http: &reqwest::Client, api: &str, id: &str, body: Option<Value>) {
    let mut request = http
        .post(format!("{api}/uploads/{id}/complete"))
        .bearer_auth(TOKEN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 202);
}

/// Completes upload `id` on the service at `api` and waits until it is
/// promoted with `rows` rows.
async fn complete_promoted(http: &reqwest::Client, api: &str, id: &str, rows: i64) {
    complete(http, api, id).await;
    wait_promoted(http, api, id, rows).await;
}

/// Waits until upload `id`, as the service at `api` reads it, is promoted
/// with `rows` rows (not failed).
async fn wait_promoted(http: &reqwest::Client, api: &str, id: &str, rows: i64) {
    let done = wait_state(
        http,
        &format!("{api}/uploads/{id}"),
        &["promoted", "failed"],
    )
    .await;
    assert_eq!(
        (text(&done, "state"), done["rows"].as_i64()),
        ("promoted".to_string(), Some(rows)),
        "{done}"
    );
}

/// GETs `url` with the test token; the JSON answer.
async fn get_json(client: &reqwest::Client, url: &str) -> Value {
    json_answer(client.get(url)).await
}

pub(super) async fn wait_state(client: &reqwest::Client, url: &str, states: &[&str]) -> Value {
    poll(url, states, || get_json(client, url)).await
}

/// The REST catalog of `session`'s connection (the body of `POST /uploads`
/// or of a credentials call), as iceberg-rust's `RestCatalog`, and a
/// DataFusion session that writes through it as catalog `lake`.
async fn rest_session(
    session: &Value,
) -> (
    Arc<dyn iceberg::Catalog>,
    datafusion::prelude::SessionContext,
) {
    try_rest_session(session).await.unwrap()
}

/// [`rest_session`], failing (a replica killed under it) with the error's
/// text.
async fn try_rest_session(
    session: &Value,
) -> std::result::Result<
    (
        Arc<dyn iceberg::Catalog>,
        datafusion::prelude::SessionContext,
    ),
    String,
> {
    use iceberg::CatalogBuilder;
    use iceberg_catalog_rest::RestCatalogBuilder;
    use iceberg_datafusion::IcebergCatalogProvider;
    use iceberg_storage_opendal::OpenDalResolvingStorageFactory;

    let props = std::collections::HashMap::from(["uri", "token"].map(|key| {
        (
            key.to_string(),
            session["connection"][key]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        )
    }));
    let catalog: Arc<dyn iceberg::Catalog> = Arc::new(
        RestCatalogBuilder::default()
            .with_storage_factory(Arc::new(OpenDalResolvingStorageFactory::new()))
            .load("icestage", props)
            .await
            .map_err(|e| e.to_string())?,
    );
    let ctx = datafusion::prelude::SessionContext::new();
    ctx.register_catalog(
        "lake",
        Arc::new(
            IcebergCatalogProvider::try_new(Arc::clone(&catalog))
                .await
                .map_err(|e| e.to_string())?,
        ),
    );
    Ok((catalog, ctx))
}

/// `INSERT INTO lake.<staging>` of `rows` USD transactions of `account`,
/// with ids `<id_prefix>0`, `<id_prefix>1`, ... and amounts 1, 2, ...
fn insert_rows(staging: &str, id_prefix: &str, account: &str, rows: usize) -> String {
    let values: Vec<String> = (0..rows)
        .map(|row| {
            format!(
                "('{id_prefix}{row}', '{account}', {}, 'usd', TIMESTAMP '2026-07-01 00:00:00Z')",
                row + 1
            )
        })
        .collect();
    format!("INSERT INTO lake.{staging} VALUES {}", values.join(", "))
}

/// Three rows into `staging` through `ctx` (plain DataFusion over the REST
/// catalog); the error's text when the commit is refused.
async fn insert_three(
    ctx: &datafusion::prelude::SessionContext,
    staging: &str,
) -> std::result::Result<(), String> {
    let sql = format!(
        "INSERT INTO lake.{staging} VALUES \
         ('t1', 'a1', 100, 'usd', TIMESTAMP '2026-07-01 00:00:00Z'), \
         ('t2', 'a2', 200, 'eur', TIMESTAMP '2026-07-02 00:00:00Z'), \
         ('t3', 'a3', 300, 'usd', TIMESTAMP '2026-07-03 00:00:00Z')"
    );
    let frame = ctx.sql(&sql).await.map_err(|e| e.to_string())?;
    frame.collect().await.map(|_| ()).map_err(|e| e.to_string())
}
