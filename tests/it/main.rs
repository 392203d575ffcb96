//! icestage's integration tests, one binary (each test binary links the
//! whole DataFusion + Iceberg stack).

mod aws;
#[cfg(feature = "cluster")]
mod cluster;
mod common;
mod docs;
mod downloads;
mod embedding;
mod exactly_once;
mod files;
mod fuzz;
mod ingest;
mod insert;
mod landing;
mod layers;
mod modes;
mod pipes;
mod postgres;
mod pyiceberg;
mod service;
mod shell;
mod slt;
mod trust;
mod upkeep;
