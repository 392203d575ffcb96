//! icestage's integration tests, one binary (each test binary links the
//! whole DataFusion + Iceberg stack).

mod common;
mod pyiceberg;
mod shell;
mod slt;
