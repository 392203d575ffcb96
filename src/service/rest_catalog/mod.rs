//! icestage's Iceberg REST catalog, under `/iceberg`: the protocol layer.
//! What any Iceberg client (PyIceberg `type="rest"`, iceberg-rust's
//! `RestCatalog`, Spark, DuckDB) calls, with a session's token or an API
//! token with the `catalog` operation.
//!
//! [`routes`] are the protocol: each handler authenticates the bearer
//! ([`auth`]), parses the path's identifiers and the body as clients send
//! them, asks the bearer's [`view::CatalogView`] and writes its answer, or
//! its error in the protocol's shape ([`error`]). What a bearer sees and
//! may do is its view's alone:
//!
//! - [`session_view`]: a session's token reaches its one table (a
//!   download's to read, an upload's to append while it is open);
//! - [`token_view`]: an API token with the `catalog` operation reaches the
//!   tables its `tables` name, with creates, drops and commits of any kind;
//!   that is what another icestage uses as its `type = "rest"` catalog.

pub(super) mod auth;
mod error;
pub(super) mod routes;
mod session_view;
mod token_view;
mod view;
