//! One service, several tenants: each `[[catalogs]]` entry a warehouse,
//! each token naming the catalogs it reaches. A tenant sees nothing of
//! another's tables, uploads or downloads (404), through the API or the
//! REST catalog, and PyIceberg chooses a catalog with `warehouse`.

use super::*;
use crate::common::{python_script, run};

const A: &str = "sk_test_tenant_a";
const B: &str = "sk_test_tenant_b";
const OPS: &str = "sk_test_operator";

/// Two tenants' catalogs (SQLite, each in its own folder under
/// `warehouse`) and their tokens; an operator's catalog token reaches both.
fn tenants_config(warehouse: &Warehouse) -> String {
    let mut text = String::new();
    for tenant in ["tenant_a", "tenant_b"] {
        let dir = warehouse.path().join(tenant);
        std::fs::create_dir_all(&dir).unwrap();
        text.push_str(&format!(
            "[[catalogs]]\nname = \"{tenant}\"\ntype = \"sql\"\n[catalogs.config]\n\
             uri = \"sqlite:{}/catalog.db?mode=rwc\"\nwarehouse = \"file://{}\"\n",
            dir.display(),
            dir.display()
        ));
    }
    text.push_str(&format!(
        "[service]\nlisten = \"127.0.0.1:0\"\nid_secret = \"tenants\"\nrequests_per_minute = 10000\n\
         [[service.tokens]]\nname = \"a\"\ntoken = \"{A}\"\ntables = [\"*\"]\n\
         operations = [\"upload\", \"download\", \"catalog\"]\ncatalogs = [\"tenant_a\"]\n\
         [[service.tokens]]\nname = \"b\"\ntoken = \"{B}\"\ntables = [\"*\"]\n\
         operations = [\"upload\", \"download\", \"catalog\"]\ncatalogs = [\"tenant_b\"]\n\
         [[service.tokens]]\nname = \"ops\"\ntoken = \"{OPS}\"\ntables = [\"*\"]\n\
         operations = [\"catalog\"]\ncatalogs = [\"tenant_a\", \"tenant_b\"]\n"
    ));
    text
}

/// `payments.transactions` in each tenant's catalog: 2 rows in A's, 3 in B's.
async fn tenant_tables(text: &str) {
    let config = ServiceConfig::from_toml_str(text).unwrap();
    let ctx = datafusion::prelude::SessionContext::new();
    icestage::register(&ctx, config.catalogs().unwrap())
        .await
        .unwrap();
    for (tenant, rows) in [("tenant_a", 2), ("tenant_b", 3)] {
        run(&ctx, &format!("CREATE SCHEMA {tenant}.payments"))
            .await
            .unwrap();
        run(
            &ctx,
            &format!(
                "CREATE TABLE {tenant}.payments.transactions (transaction_id VARCHAR NOT NULL, \
                 account_id VARCHAR NOT NULL, amount_cents BIGINT NOT NULL, currency VARCHAR NOT NULL, \
                 created_at TIMESTAMP WITH TIME ZONE NOT NULL)"
            ),
        )
        .await
        .unwrap();
        let values: Vec<String> = (0..rows)
            .map(|i| format!("('t{i}', 'a', {i}, 'usd', TIMESTAMP '2026-07-01 00:00:00Z')"))
            .collect();
        run(
            &ctx,
            &format!(
                "INSERT INTO {tenant}.payments.transactions VALUES {}",
                values.join(", ")
            ),
        )
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_see_nothing_of_each_other() {
    let warehouse = Warehouse::new();
    let config = tenants_config(&warehouse);
    tenant_tables(&config).await;
    let path = warehouse.path().join("service.toml");
    std::fs::write(&path, &config).unwrap();
    let service = Service::start(&path);
    let http = reqwest::Client::new();
    let api = &service.url;
    let get = |url: String, token: &'static str| {
        let http = http.clone();
        async move {
            let response = http.get(url).bearer_auth(token).send().await.unwrap();
            let status = response.status().as_u16();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };

    // A's upload is in A's catalog; B cannot see it, not even that it exists.
    let upload = post_as(
        &http,
        format!("{api}/uploads"),
        A,
        json!({"table": "payments.transactions"}),
    )
    .await;
    assert_eq!(text(&upload, "catalog"), "tenant_a", "{upload}");
    let id = text(&upload, "upload_id");
    assert_eq!(get(format!("{api}/uploads/{id}"), A).await.0, 200);
    let (status, answer) = get(format!("{api}/uploads/{id}"), B).await;
    assert_eq!(status, 404, "{answer}");
    // Nor may B name A's catalog.
    let refused = http
        .post(format!("{api}/uploads"))
        .bearer_auth(B)
        .json(&json!({"table": "payments.transactions", "catalog": "tenant_a"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 404);

    // B's download reads B's table and lands in B's catalog.
    let download = post_as(
        &http,
        format!("{api}/downloads"),
        B,
        json!({"table": "payments.transactions"}),
    )
    .await;
    let download_id = text(&download, "download_id");
    let ready = loop {
        let (_, status) = get(format!("{api}/downloads/{download_id}"), B).await;
        if text(&status, "state") != "pending" {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        (
            text(&ready, "state"),
            ready["rows"].as_i64(),
            text(&ready, "catalog")
        ),
        ("ready".to_string(), Some(3), "tenant_b".to_string()),
        "{ready}"
    );
    assert_eq!(
        get(format!("{api}/downloads/{download_id}"), A).await.0,
        404
    );

    // The REST catalog: B's token under A's prefix, or asking for A's
    // warehouse, finds nothing; without a prefix it is in B's catalog.
    let rest = format!("{api}/iceberg/v1");
    for url in [
        format!("{rest}/config?warehouse=tenant_a"),
        format!("{rest}/tenant_a/namespaces"),
        format!("{rest}/tenant_a/namespaces/payments/tables/transactions"),
        format!("{rest}/tenant_c/namespaces"),
    ] {
        let (status, answer) = get(url.clone(), B).await;
        assert_eq!(status, 404, "{url}: {answer}");
    }
    // Names travel percent-encoded under a prefix, as without one.
    let (status, answer) = get(format!("{rest}/tenant_b/namespaces/no%20such"), OPS).await;
    assert_eq!(
        (status, &answer["error"]["type"]),
        (404, &json!("NoSuchNamespaceException")),
        "{answer}"
    );
    let (status, config) = get(format!("{rest}/config?warehouse=tenant_b"), B).await;
    assert_eq!(
        (status, &config["overrides"]),
        (200, &json!({"prefix": "tenant_b"}))
    );
    // A's upload session token reaches its staging table in A's catalog
    // only.
    let session = upload["connection"]["token"].as_str().unwrap();
    let staging = text(&upload, "staging_table");
    let staging = staging.strip_prefix("staging.").unwrap();
    for (prefix, want) in [("", 200), ("tenant_a/", 200), ("tenant_b/", 404)] {
        let response = http
            .get(format!(
                "{rest}/{prefix}namespaces/staging/tables/{staging}"
            ))
            .bearer_auth(session)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), want, "{prefix}");
    }

    // PyIceberg chooses the catalog with `warehouse`: the operator's token
    // reaches both, each tenant's its own.
    let uri = format!("{api}/iceberg");
    for (token, warehouse, want) in [
        (OPS, "tenant_a", json!({"rows": 2})),
        (OPS, "tenant_b", json!({"rows": 3})),
        (B, "tenant_b", json!({"rows": 3})),
    ] {
        let out = python_script(
            "rest_tenant.py",
            &[&uri, token, warehouse, "payments.transactions"],
        );
        assert_eq!(
            serde_json::from_str::<Value>(out.trim()).unwrap(),
            want,
            "{warehouse}"
        );
    }
    let out = python_script(
        "rest_tenant.py",
        &[&uri, B, "tenant_a", "payments.transactions"],
    );
    let out: Value = serde_json::from_str(out.trim()).unwrap();
    assert!(
        text(&out, "error").contains("does not exist or this token does not reach it"),
        "{out}"
    );
}

/// A token naming a catalog that is not configured stops the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_naming_an_unknown_catalog_is_refused_at_start() {
    let warehouse = Warehouse::new();
    let text = tenants_config(&warehouse)
        .replace("catalogs = [\"tenant_b\"]", "catalogs = [\"tenant_z\"]");
    let config = ServiceConfig::from_toml_str(&text).unwrap();
    let error = match AppState::new(config).await {
        Ok(_) => panic!("a token naming tenant_z opened"),
        Err(e) => e.to_string(),
    };
    assert!(
        error.contains("token 'b' names catalog 'tenant_z', which is not configured")
            && error.contains("tenant_a, tenant_b"),
        "{error}"
    );
}

async fn post_as(http: &reqwest::Client, url: String, token: &str, body: Value) -> Value {
    let response = http
        .post(url)
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    response.json().await.unwrap()
}
