//! Plain Iceberg tables: `CREATE SCHEMA`, `CREATE TABLE [AS SELECT]`
//! ([`ddl`]), the validation rules stored with a target table
//! ([`rules`]), and `REWRITE MANIFESTS` ([`maintain`]).

pub(crate) mod ddl;
pub(crate) mod maintain;
pub(crate) mod rules;
