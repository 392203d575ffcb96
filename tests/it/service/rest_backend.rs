//! icestage on another icestage's REST catalog: one `icestage serve` holds
//! the tables; a second icestage reaches them as `type = "rest"` with an
//! API token that has the `catalog` operation, and runs its uploads,
//! downloads and COPY INTO there.

use icestage::{CatalogConfig, IcestageConfig};

use super::*;
use crate::common::{create_upload, value};

/// The serving icestage's catalog token: every table.
const LAKE_TOKEN: &str = "sk_test_lake";

fn catalog_token() -> String {
    format!(
        r#"
[[service.tokens]]
name = "lake"
token = "{LAKE_TOKEN}"
tables = ["*"]
operations = ["catalog"]
"#
    )
}

/// A session whose one catalog, `lake`, is `service`'s REST catalog.
async fn lake_session(service: &Service, token: &str) -> icestage::Result<SessionContext> {
    lake_session_with(service, "token", token).await
}

/// [`lake_session`] with `key = value` as its identity (`token` or
/// `credential`).
async fn lake_session_with(
    service: &Service,
    key: &str,
    value: &str,
) -> icestage::Result<SessionContext> {
    let ctx = SessionContext::new();
    icestage::register(
        &ctx,
        IcestageConfig {
            default_catalog: None,
            catalogs: vec![CatalogConfig {
                name: "lake".to_string(),
                kind: "rest".to_string(),
                config: BTreeMap::from([
                    ("uri".to_string(), format!("{}/iceberg", service.url)),
                    (key.to_string(), value.to_string()),
                ]),
            }],
            limits: Default::default(),
        },
    )
    .await?;
    Ok(ctx)
}

use datafusion::prelude::SessionContext;

async fn insert(ctx: &SessionContext, staging: &str, prefix: &str) {
    run(
        ctx,
        &format!(
            "INSERT INTO {staging} VALUES \
             ('{prefix}1', 'a1', 100, 'usd', TIMESTAMP '2026-07-01 00:00:00Z'), \
             ('{prefix}2', 'a1', 250, 'usd', TIMESTAMP '2026-07-01 00:00:00Z'), \
             ('{prefix}3', 'a2', 300, 'eur', TIMESTAMP '2026-07-02 00:00:00Z')"
        ),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn icestage_runs_on_another_icestage_s_rest_catalog() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let service = Service::start(&write_config(&warehouse, &catalog_token()));
    // Tokens without the catalog operation, and none at all, open nothing.
    for token in [TOKEN, "sk_nobody"] {
        let refused = match lake_session(&service, token).await {
            Ok(_) => panic!("token {token} opened the REST catalog"),
            Err(e) => e.to_string(),
        };
        assert!(refused.contains("/v1/config answered"), "{refused}");
    }
    let lake = lake_session(&service, LAKE_TOKEN).await.unwrap();

    // An upload: opened, written and promoted through the REST catalog.
    let upload = create_upload(&lake, "payments.transactions").await;
    insert(&lake, &upload.staging_table, "t").await;
    let promoted = run(&lake, &format!("PROMOTE UPLOAD '{}'", upload.id))
        .await
        .unwrap();
    assert_eq!(value(&promoted, "state"), "promoted");
    assert_eq!(value(&promoted, "rows"), "3");
    // The staged files stay under the session's table, which a REST catalog
    // may delete with it: they are copied into the target, never shared.
    assert_eq!(value(&promoted, "path"), "copy");
    let again = run(&lake, &format!("PROMOTE UPLOAD '{}'", upload.id))
        .await
        .unwrap();
    assert_eq!(value(&again, "state"), "promoted");
    // The serving icestage holds the rows, once; the staging table is gone.
    let home = warehouse.session().await;
    assert_eq!(
        scalar(&home, "SELECT count(*) FROM payments.transactions").await,
        "3"
    );
    assert!(
        run(&home, &format!("SELECT * FROM {}", upload.staging_table))
            .await
            .is_err()
    );

    // A promotion and an abort of one upload, from two sessions at once:
    // exactly one of them takes it, and the target agrees.
    let raced = create_upload(&lake, "payments.transactions").await;
    insert(&lake, &raced.staging_table, "r").await;
    let other = lake_session(&service, LAKE_TOKEN).await.unwrap();
    let (promote, abort) = (
        format!("PROMOTE UPLOAD '{}'", raced.id),
        format!("ABORT UPLOAD '{}'", raced.id),
    );
    let (promote, abort) = tokio::join!(run(&lake, &promote), run(&other, &abort));
    let state = scalar(
        &lake,
        &format!("SELECT state FROM upload_status('{}')", raced.id),
    )
    .await;
    let rows = scalar(&home, "SELECT count(*) FROM payments.transactions").await;
    match (promote, abort) {
        (Ok(_), Err(refused)) => {
            eprintln!("the promotion won: {refused}");
            assert_eq!((state.as_str(), rows.as_str()), ("promoted", "6"));
            assert!(refused.to_string().contains("promot"), "{refused}");
        }
        (Err(refused), Ok(_)) => {
            eprintln!("the abort won: {refused}");
            assert_eq!((state.as_str(), rows.as_str()), ("aborted", "3"));
            assert!(refused.to_string().contains("abort"), "{refused}");
        }
        (promote, abort) => panic!("promote {promote:?}, abort {abort:?}: state {state}"),
    }

    // A download: written into a table of the REST catalog, read back.
    let opened = run(
        &lake,
        "CREATE DOWNLOAD WITH (wait = true) AS \
         SELECT account_id, count(*) AS n FROM payments.transactions GROUP BY account_id",
    )
    .await
    .unwrap();
    assert_eq!(value(&opened, "state"), "ready");
    let table = value(&opened, "download_table");
    assert_eq!(
        scalar(&lake, &format!("SELECT sum(n) FROM {table}")).await,
        rows
    );
    run(
        &lake,
        &format!("DROP DOWNLOAD '{}'", value(&opened, "download_id")),
    )
    .await
    .unwrap();

    // COPY INTO a new table of the REST catalog; a second run loads nothing.
    let orders = crate::common::repo().join("sql/data/orders/");
    let copy = format!(
        "COPY INTO raw.orders FROM '{}' WITH (all_files = true)",
        orders.display()
    );
    let first = run(&lake, &copy).await.unwrap();
    assert_ne!(value(&first, "rows"), "0");
    let copied = scalar(&home, "SELECT count(*) FROM raw.orders").await;
    assert_eq!(value(&first, "rows"), copied);
    let second = run(&lake, &copy).await.unwrap();
    assert_eq!(value(&second, "rows"), "0");
}

/// `icestage serve` on a REST catalog: the serving icestage B keeps its
/// tables in icestage A's catalog. A client of B gets B's own REST catalog
/// (the session's token, its staging table only), writes through it (B
/// forwards the append to A, pinned to the version it checked) and the
/// upload lands in A's target once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn icestage_serve_runs_uploads_on_a_rest_catalog() {
    use iceberg::TableIdent;

    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let home = Service::start(&write_config(&warehouse, &catalog_token()));
    let front_config = warehouse.path().join("front.toml");
    std::fs::write(
        &front_config,
        format!(
            r#"
[[catalogs]]
name = "lake"
type = "rest"
[catalogs.config]
uri = "{}/iceberg"
token = "{LAKE_TOKEN}"
[service]
listen = "127.0.0.1:0"
requests_per_minute = 10000
[[service.tokens]]
name = "acme"
token = "{TOKEN}"
tables = ["payments.transactions"]
operations = ["upload", "download"]
"#,
            home.url
        ),
    )
    .unwrap();
    let front = Service::start(&front_config);
    let http = reqwest::Client::new();
    let upload = post_json(
        &http,
        format!("{}/uploads", front.url),
        json!({"table": "payments.transactions"}),
    )
    .await;
    // The client's catalog is the front's own, never the home catalog.
    assert_eq!(
        upload["connection"]["uri"].as_str(),
        Some(format!("{}/iceberg", front.url).as_str()),
        "{upload}"
    );
    let (catalog, ctx) = rest_session(&upload).await;
    // The client reaches its staging table through the front, and nothing
    // else: not the target, not the home catalog's own tables.
    for other in [["payments", "transactions"], ["icestage", "upload_log"]] {
        let other = TableIdent::from_strs(other).unwrap();
        assert!(catalog.load_table(&other).await.is_err(), "{other}");
    }
    let staging = text(&upload, "staging_table");
    insert_three(&ctx, &staging).await.unwrap();
    let id = text(&upload, "upload_id");
    complete_promoted(&http, &front.url, &id, 3).await;
    assert_eq!(
        scalar(
            &warehouse.session().await,
            "SELECT count(*) FROM payments.transactions"
        )
        .await,
        "3"
    );
    // The session's token ended with it.
    assert!(insert_three(&ctx, &staging).await.is_err());
}

/// icestage on a REST catalog with OAuth2 client credentials instead of a
/// token: it fetches its tokens from the catalog's endpoint and keeps
/// working past the first one's expiry; a wrong secret stops the opening
/// with what the endpoint said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn icestage_on_a_rest_catalog_with_client_credentials_outlives_its_tokens() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let config = format!("oauth_token_lifetime = \"2s\"\n{}", catalog_token());
    let service = Service::start(&write_config(&warehouse, &config));
    let refused = match lake_session_with(&service, "credential", "lake:wrong").await {
        Ok(_) => panic!("a wrong secret opened the catalog"),
        Err(e) => e.to_string(),
    };
    assert!(
        refused.contains("401") && refused.contains("check the credential"),
        "{refused}"
    );
    let lake = lake_session_with(&service, "credential", &format!("lake:{LAKE_TOKEN}"))
        .await
        .unwrap();
    for round in ["a", "b"] {
        let upload = create_upload(&lake, "payments.transactions").await;
        insert(&lake, &upload.staging_table, round).await;
        let promoted = run(&lake, &format!("PROMOTE UPLOAD '{}'", upload.id))
            .await
            .unwrap();
        assert_eq!(value(&promoted, "state"), "promoted", "round {round}");
        // Past the first token's lifetime before the second round.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    assert_eq!(
        scalar(&lake, "SELECT count(*) FROM lake.payments.transactions").await,
        "6"
    );
}
