//! `GET /openapi.json`: the API, described for clients and tools.

use axum::Json;
use datafusion::arrow::datatypes::DataType;
use serde_json::{Value, json};

use crate::credentials::vend::SessionCredentials;
use crate::download::create::DownloadOpened;
use crate::download::status::DownloadStatus;
use crate::ingest::read::vocabulary;
use crate::rows::{ResultRow, is_json};
use crate::upload::abort::UploadAborted;
use crate::upload::create::UploadOpened;
use crate::upload::publish::Published;
use crate::upload::status::{UploadFinding, UploadStatus};

fn error() -> Value {
    json!({"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}})
}

fn ok(description: &str, schema: &str) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}})
}

fn id_parameter() -> Value {
    json!({"name": "id", "in": "path", "required": true, "schema": {"type": "string", "pattern": "^[0-9a-f]{32}$"}})
}

fn errors(mut responses: Value) -> Value {
    for code in [
        "400", "401", "403", "404", "409", "413", "422", "429", "500", "504",
    ] {
        responses[code] = error();
    }
    responses
}

/// The JSON schema of one column as the API writes it (Arrow's JSON writer:
/// timestamps as RFC 3339 strings; JSON columns as the objects they hold).
fn column_schema(field: &datafusion::arrow::datatypes::Field) -> Value {
    let mut schema = match field.data_type() {
        _ if is_json(field) => json!({"type": "object"}),
        DataType::List(item) | DataType::LargeList(item) => {
            json!({"type": "array", "items": column_schema(item)})
        }
        kind => match vocabulary(kind) {
            "integer" => json!({"type": "integer"}),
            "float" => json!({"type": "number"}),
            "boolean" => json!({"type": "boolean"}),
            "date" => json!({"type": "string", "format": "date"}),
            "timestamp" => json!({"type": "string", "format": "date-time"}),
            _ => json!({"type": "string"}),
        },
    };
    if field.is_nullable() {
        schema["nullable"] = json!(true);
    }
    schema
}

/// The response schema of result row `T`: the columns SQL shows, typed as
/// the row declares them, so the document cannot drift from the answers.
/// The body always carries every column (NULL as `null`).
fn row_schema<T: ResultRow>() -> Value {
    let schema = T::schema();
    let mut properties = serde_json::Map::new();
    for field in schema.fields() {
        properties.insert(field.name().clone(), column_schema(field));
    }
    let required: Vec<&String> = schema.fields().iter().map(|f| f.name()).collect();
    json!({"type": "object", "required": required, "properties": properties})
}

/// `schema` with a property added (what the handler adds to the row).
fn with_property(mut schema: Value, name: &str, property: Value, required: bool) -> Value {
    schema["properties"][name] = property;
    if required && let Some(list) = schema["required"].as_array_mut() {
        list.push(json!(name));
    }
    schema
}

/// `schema` without a property (what the handler leaves out of the row).
fn without_property(mut schema: Value, name: &str) -> Value {
    if let Some(properties) = schema["properties"].as_object_mut() {
        properties.remove(name);
    }
    if let Some(list) = schema["required"].as_array_mut() {
        list.retain(|n| n != name);
    }
    schema
}

/// The OpenAPI 3 document.
pub(crate) fn spec() -> Value {
    let mut spec = api();
    let connection = |what: &str| json!({"type": "object", "description": what});
    let schemas = &mut spec["components"]["schemas"];
    schemas["Upload"] = with_property(
        row_schema::<UploadOpened>(),
        "connection",
        connection(
            "properties for PyIceberg's load_catalog(name, **props): this service's Iceberg REST \
             catalog (/iceberg) with a token for the staging table alone; null once the upload is \
             promoted",
        ),
        true,
    );
    schemas["UploadStatus"] = row_schema::<UploadStatus>();
    schemas["UploadAborted"] = row_schema::<UploadAborted>();
    schemas["Published"] = row_schema::<Published>();
    schemas["Download"] = with_property(
        row_schema::<DownloadOpened>(),
        "connection",
        connection(
            "this service's Iceberg REST catalog with a read-only token for the download table",
        ),
        true,
    );
    schemas["DownloadStatus"] = row_schema::<DownloadStatus>();
    let credentials = without_property(row_schema::<SessionCredentials>(), "catalog_config");
    let credentials = with_property(
        credentials,
        "connection",
        connection("the REST catalog connection, with a new session token"),
        true,
    );
    // Without storage keys (the service signs every storage request) the
    // answer is the id, `remote_signing` and the connection alone.
    schemas["Credentials"] = with_property(
        credentials,
        "remote_signing",
        json!({"type": "boolean", "description": "true when no keys are vended: the catalog signs each storage request"}),
        false,
    );
    schemas["Findings"]["properties"]["items"]["items"] =
        without_property(row_schema::<UploadFinding>(), "upload_id");
    spec["paths"]["/metrics"] = json!({"get": {
        "summary": "Prometheus' text format, with [service] metrics_token as the bearer token",
        "security": [{"metrics": []}],
        "responses": {"200": {"description": "text/plain; version=0.0.4"}, "401": error(), "404": error()}}});
    spec["paths"]["/iceberg/v1/oauth/tokens"] = json!({"post": {
        "summary": "OAuth2 client credentials: an API token's name and secret give a short-lived bearer token",
        "security": [],
        "requestBody": {"required": true, "content": {"application/x-www-form-urlencoded": {
            "schema": {"$ref": "#/components/schemas/TokenRequest"}}}},
        "responses": {"200": ok("a bearer token", "TokenResponse"), "400": ok("OAuth error", "OAuthError"),
            "401": ok("OAuth error", "OAuthError"), "429": ok("OAuth error", "OAuthError")}}});
    let string = json!({"type": "string"});
    let schemas = &mut spec["components"]["schemas"];
    schemas["TokenRequest"] = json!({"type": "object", "required": ["grant_type"], "properties": {
        "grant_type": {"type": "string", "enum": ["client_credentials"]},
        "client_id": {"type": "string", "description": "the API token's name"},
        "client_secret": {"type": "string", "description": "the API token's secret"},
        "scope": string}});
    schemas["TokenResponse"] = json!({"type": "object", "required": ["access_token", "token_type", "expires_in"],
        "properties": {"access_token": string, "token_type": string, "expires_in": {"type": "integer"},
            "issued_token_type": string, "scope": string}});
    schemas["OAuthError"] = json!({"type": "object", "required": ["error"],
        "properties": {"error": string, "error_description": string}});
    spec
}

/// The upload and download endpoints.
fn api() -> Value {
    let string = json!({"type": "string"});
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "icestage",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Staged bulk uploads and downloads over Apache Iceberg: write rows into a staging \
                table with any Iceberg client, then complete; read a download table with read-only access. \
                Clients reach their one table through the Iceberg REST catalog under /iceberg (the Apache \
                Iceberg REST catalog specification, not repeated here), with the session token in each \
                connection this API answers.",
        },
        "security": [{"bearer": []}],
        "paths": {
            "/healthz": {"get": {"summary": "liveness and catalog reachability", "security": [],
                "responses": {"200": {"description": "ok"}}}},
            "/uploads": {"post": {"summary": "open an upload: a staging table with the target's schema",
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/CreateUpload"}}}},
                "responses": errors(json!({"201": ok("the upload", "Upload")}))}},
            "/uploads/{id}": {
                "get": {"summary": "state, counts and findings summary", "parameters": [id_parameter()],
                    "description": "A promotion whose replica stopped before it finished (its claim lapsed) is finished by the replica answering, with the options its complete asked for.",
                    "responses": errors(json!({"200": ok("status", "UploadStatus")}))},
                "delete": {"summary": "abort: discard the staged rows", "parameters": [id_parameter()],
                    "responses": errors(json!({"200": ok("aborted", "UploadAborted")}))}},
            "/uploads/{id}/credentials": {"post": {"summary": "credentials for the staging table only",
                "parameters": [id_parameter()], "responses": errors(json!({"200": ok("credentials", "Credentials")}))}},
            "/uploads/{id}/complete": {"post": {"summary": "validate and promote in the background",
                "description": "The upload reads `promoting` from the 202 on, on every replica, until its promotion ends `promoted` or `failed`.",
                "parameters": [id_parameter()],
                "requestBody": {"required": false, "content": {"application/json": {"schema": {"type": "object",
                    "additionalProperties": false, "properties": {
                        "mode": {"type": "string", "enum": ["append", "upsert", "replace_partitions"], "default": "append"},
                        "key": {"type": "array", "items": {"type": "string"},
                            "description": "an upsert's key columns (default: the target's identifier fields or its one UNIQUE rule)"},
                        "tag": {"type": "boolean", "default": false,
                            "description": "tag the snapshot holding the rows upload-<id>"},
                        "to_branch": {"type": "string",
                            "description": "land the rows on this audit branch of the target (created if missing); publish them with /uploads/{id}/publish"}}}}}},
                "responses": errors(json!({"202": ok("accepted: poll GET /uploads/{id} until promoted or failed", "Accepted")}))}},
            "/uploads/{id}/publish": {"post": {"summary": "publish an upload promoted to an audit branch on the target's main, exactly once, its rules checked again",
                "parameters": [id_parameter()],
                "responses": errors(json!({"200": ok("published", "Published")}))}},
            "/uploads/{id}/findings": {"get": {"summary": "row-level findings, paged", "parameters": [id_parameter(),
                    {"name": "page", "in": "query", "schema": {"type": "integer", "minimum": 1}},
                    {"name": "page_size", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}],
                "responses": errors(json!({"200": ok("findings", "Findings")}))}},
            "/downloads": {"post": {"summary": "start a download of a table, filtered",
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/CreateDownload"}}}},
                "responses": errors(json!({"202": ok("the download", "Download")}))}},
            "/downloads/{id}": {"get": {"summary": "pending, ready or failed", "parameters": [id_parameter()],
                "responses": errors(json!({"200": ok("status", "DownloadStatus")}))}},
            "/downloads/{id}/credentials": {"post": {"summary": "read-only credentials for the download table",
                "parameters": [id_parameter()], "responses": errors(json!({"200": ok("credentials", "Credentials")}))}},
            "/openapi.json": {"get": {"summary": "this document", "security": [], "responses": {"200": {"description": "OpenAPI 3"}}}},
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                "metrics": {"type": "http", "scheme": "bearer", "description": "[service] metrics_token"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "object",
                    "required": ["code", "message"], "properties": {"code": string, "message": string}}}},
                "CreateUpload": {"type": "object", "required": ["table"], "additionalProperties": false, "properties": {
                    "table": {"type": "string", "example": "payments.transactions"},
                    "catalog": {"type": "string", "description": "a catalog the token reaches (default: its first)"},
                    "ttl": {"type": "string", "example": "24h"},
                    "idempotency_key": {"type": "string", "description": "a retried create with the same key returns the same upload"}}},
                "Accepted": {"type": "object", "required": ["upload_id", "state"], "properties": {
                    "upload_id": string, "state": {"type": "string", "description": "promoting, or where the upload already stands"}}},
                "Findings": {"type": "object", "required": ["upload_id", "page", "page_size", "total", "items"], "properties": {"upload_id": string, "page": {"type": "integer"},
                    "page_size": {"type": "integer"}, "total": {"type": "integer"}, "items": {"type": "array", "items": {"type": "object"}}}},
                "CreateDownload": {"type": "object", "required": ["table"], "additionalProperties": false, "properties": {
                    "table": string, "ttl": string,
                    "catalog": {"type": "string", "description": "a catalog the token reaches (default: its first); the download table goes there too"},
                    "columns": {"type": "array", "items": {"type": "string"}},
                    "filter": {"type": "array", "items": {"type": "object", "required": ["column", "op"],
                        "additionalProperties": false, "properties": {"column": string,
                        "op": {"type": "string", "enum": ["eq", "ne", "lt", "le", "gt", "ge", "in", "is_null", "not_null"]},
                        "value": {"description": "typed as the column: number, string, boolean, date or timestamp string, or an array for in"}}}},
                    "limit": {"type": "integer", "minimum": 1},
                    "include_files": {"type": "boolean", "default": false, "description": "copy the files the rows' FILE columns reference into the download's own folder (each verified against its row's size and SHA-256) and point the rows at the copies, so the download's access reaches them"}}},
            }
        }
    })
}

pub(crate) async fn document() -> Json<Value> {
    Json(spec())
}
