//! What one icestage operation is: a request type whose fields are the
//! operation's arguments, parsed and checked, and a `run` next to it that
//! answers the operation's typed outcome. The statement planner, the table
//! functions, the typed API and the HTTP service build requests; the command
//! table (`plan::command`) lists them once and runs them all the same way.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{Schema, SchemaRef};

use super::CommandContext;
use crate::error::Result;
use crate::rows::ResultRow;

/// One icestage operation with its arguments. Its `Display` is what
/// `EXPLAIN` shows after the name.
pub(crate) trait Operation: fmt::Debug + fmt::Display + Send + Sync + 'static {
    /// The name `EXPLAIN` shows.
    const NAME: &'static str;

    /// What the operation answers.
    type Outcome: Outcome;

    /// The columns the outcome becomes.
    fn schema(&self) -> SchemaRef {
        Self::Outcome::schema()
    }

    /// Runs the operation in `ctx`.
    fn run(&self, ctx: &CommandContext) -> impl Future<Output = Result<Self::Outcome>> + Send;
}

/// An operation's typed outcome, and the rows SQL shows for it.
pub(crate) trait Outcome: Send {
    /// The columns, unless the operation says otherwise.
    fn schema() -> SchemaRef;

    /// The outcome as one batch of `schema` (the operation's).
    fn into_batch(self, schema: SchemaRef) -> Result<RecordBatch>;
}

/// One row.
impl<T: ResultRow + Send> Outcome for T {
    fn schema() -> SchemaRef {
        T::schema()
    }

    fn into_batch(self, _: SchemaRef) -> Result<RecordBatch> {
        T::to_batch(&[self])
    }
}

/// A row each.
impl<T: ResultRow + Send> Outcome for Vec<T> {
    fn schema() -> SchemaRef {
        T::schema()
    }

    fn into_batch(self, _: SchemaRef) -> Result<RecordBatch> {
        T::to_batch(&self)
    }
}

/// No rows, no columns: a statement that only changes something.
impl Outcome for () {
    fn schema() -> SchemaRef {
        Arc::new(Schema::empty())
    }

    fn into_batch(self, schema: SchemaRef) -> Result<RecordBatch> {
        Ok(RecordBatch::new_empty(schema))
    }
}

/// Whether there was something to change (`DROP ... IF EXISTS`): no rows,
/// no columns.
impl Outcome for bool {
    fn schema() -> SchemaRef {
        <() as Outcome>::schema()
    }

    fn into_batch(self, schema: SchemaRef) -> Result<RecordBatch> {
        ().into_batch(schema)
    }
}

/// Rows the operation built itself, of the schema it declares.
impl Outcome for RecordBatch {
    fn schema() -> SchemaRef {
        <() as Outcome>::schema()
    }

    fn into_batch(self, _: SchemaRef) -> Result<RecordBatch> {
        Ok(self)
    }
}

/// `, flag` when `on`: how EXPLAIN shows a boolean option that is set.
pub(crate) fn flag(on: bool, name: &str) -> String {
    if on {
        format!(", {name}")
    } else {
        String::new()
    }
}
