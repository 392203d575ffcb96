//! Plain Iceberg tables: `CREATE SCHEMA`, `CREATE TABLE [AS SELECT]`
//! ([`ddl`]), and the validation rules stored with a target table
//! ([`rules`]).

pub(crate) mod ddl;
pub(crate) mod rules;
