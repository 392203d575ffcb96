//! OAuth2 client credentials on the REST catalog: PyIceberg configured
//! with `credential = "name:secret"` and no token works past its first
//! token's expiry; the token endpoint answers bad requests with OAuth's
//! error bodies.

use super::*;

const LAKE_SECRET: &str = "sk_test_lake";

fn oauth_config(warehouse: &Warehouse) -> std::path::PathBuf {
    write_config(
        warehouse,
        &format!(
            "oauth_token_lifetime = \"2s\"\n\
             [[service.tokens]]\nname = \"lake\"\ntoken = \"{LAKE_SECRET}\"\n\
             tables = [\"payments.*\"]\noperations = [\"catalog\"]\n"
        ),
    )
}

/// `POST /iceberg/v1/oauth/tokens` with a form body; status and JSON.
async fn token_request(service: &Service, form: &[(&str, &str)]) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{}/iceberg/v1/oauth/tokens", service.url))
        .form(form)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyiceberg_with_client_credentials_works_past_its_token_s_expiry() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let service = Service::start(&oauth_config(&warehouse));
    let out = python_script(
        "rest_oauth.py",
        &[
            &format!("{}/iceberg", service.url),
            &format!("lake:{LAKE_SECRET}"),
            "payments.transactions",
            "4",
            "3",
        ],
    );
    let out: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(out["tables"], json!(["payments.transactions"]), "{out}");
    assert_eq!(out["rows"], 4, "{out}");
    let ctx = warehouse.session().await;
    assert_eq!(
        scalar(&ctx, "SELECT count(*) FROM payments.transactions").await,
        "4"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_endpoint_grants_client_credentials_only() {
    let warehouse = Warehouse::new();
    target(&warehouse).await;
    let service = Service::start(&oauth_config(&warehouse));
    let http = reqwest::Client::new();
    let namespaces = format!("{}/iceberg/v1/namespaces", service.url);

    let (status, granted) = token_request(
        &service,
        &[
            ("grant_type", "client_credentials"),
            ("client_id", "lake"),
            ("client_secret", LAKE_SECRET),
            ("scope", "catalog"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{granted}");
    assert_eq!(
        (
            &granted["token_type"],
            &granted["expires_in"],
            &granted["scope"]
        ),
        (&json!("bearer"), &json!(2), &json!("catalog"))
    );
    let bearer = granted["access_token"].as_str().unwrap().to_string();
    let listed = http
        .get(&namespaces)
        .bearer_auth(&bearer)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200);
    // Past its expiry the token opens nothing, and says what to do.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let expired = http
        .get(&namespaces)
        .bearer_auth(&bearer)
        .send()
        .await
        .unwrap();
    assert_eq!(expired.status(), 401);
    let body: Value = expired.json().await.unwrap();
    assert!(
        text(&body["error"], "message").contains("POST /iceberg/v1/oauth/tokens"),
        "{body}"
    );
    // A bearer token is not a client secret: it cannot renew itself.
    let (status, _) = token_request(
        &service,
        &[
            ("grant_type", "client_credentials"),
            ("client_secret", &bearer),
        ],
    )
    .await;
    assert_eq!(status, 401);

    for (form, want_status, want_error) in [
        (
            vec![
                ("grant_type", "client_credentials"),
                ("client_id", "lake"),
                ("client_secret", "wrong"),
            ],
            401,
            "invalid_client",
        ),
        (
            // The secret of another token's name.
            vec![
                ("grant_type", "client_credentials"),
                ("client_id", "acme"),
                ("client_secret", LAKE_SECRET),
            ],
            401,
            "invalid_client",
        ),
        (
            vec![("grant_type", "password"), ("client_secret", LAKE_SECRET)],
            400,
            "unsupported_grant_type",
        ),
        (
            vec![("grant_type", "client_credentials")],
            400,
            "invalid_request",
        ),
    ] {
        let (status, body) = token_request(&service, &form).await;
        assert_eq!(
            (status, text(&body, "error").as_str()),
            (want_status, want_error),
            "{form:?}: {body}"
        );
        assert!(!text(&body, "error_description").is_empty(), "{body}");
    }
    // HTTP Basic authentication carries the same credentials.
    let basic = http
        .post(format!("{}/iceberg/v1/oauth/tokens", service.url))
        .basic_auth("lake", Some(LAKE_SECRET))
        .form(&[("grant_type", "client_credentials")])
        .send()
        .await
        .unwrap();
    assert_eq!(basic.status(), 200);
}
