//! Plain Iceberg tables: `CREATE SCHEMA`, `CREATE TABLE [AS SELECT]`
//! ([`ddl`]), the validation rules stored with a target table
//! ([`rules`]), the file references a column can hold ([`files`]), and
//! their maintenance: `REWRITE MANIFESTS`, `REWRITE DATA FILES`,
//! `REMOVE ORPHAN FILES` ([`maintain`]) and `EXPIRE SNAPSHOTS` ([`expire`]).

pub(crate) mod ddl;
pub(crate) mod expire;
pub(crate) mod files;
pub(crate) mod maintain;
pub(crate) mod rules;
