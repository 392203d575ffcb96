//! icestage's SQL: the statement parser and the script helpers (statement
//! splitting and psql-style variables) that the shell and the test runner share.

pub mod parser;
pub mod script;
