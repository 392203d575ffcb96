//! Pipe and copy table functions: `pipes()`, `pipe_status('<name>')`,
//! `copy_rejects('<table>')`.

use std::sync::Arc;

use datafusion::catalog::{TableFunctionImpl, TableProvider};
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::Expr;

use super::{CommandTable, at_most, string_arg};
use crate::ingest::copy_into::CopyRejects;
use crate::pipe::PipeName;
use crate::pipe::status::{ListPipes, ShowPipe};

/// `pipes()`: every pipe of every catalog.
#[derive(Debug)]
pub(crate) struct PipesFunc;

impl TableFunctionImpl for PipesFunc {
    fn call(&self, args: &[Expr]) -> DFResult<Arc<dyn TableProvider>> {
        at_most(args, 0, "pipes", "pipes()")?;
        Ok(CommandTable::of(ListPipes))
    }
}

/// `pipe_status('<name>')`: one row, where the pipe stands.
#[derive(Debug)]
pub(crate) struct PipeStatusFunc;

impl TableFunctionImpl for PipeStatusFunc {
    fn call(&self, args: &[Expr]) -> DFResult<Arc<dyn TableProvider>> {
        let signature = "pipe_status('<pipe name>')";
        at_most(args, 1, "pipe_status", signature)?;
        let name = PipeName::parse(&string_arg(args, 0, "pipe_status", signature)?)?;
        Ok(CommandTable::of(ShowPipe { name }))
    }
}

/// `copy_rejects('<table>')`: the rows `COPY INTO` (and pipes) rejected
/// with `on_error = 'continue'`, newest first.
#[derive(Debug)]
pub(crate) struct CopyRejectsFunc;

impl TableFunctionImpl for CopyRejectsFunc {
    fn call(&self, args: &[Expr]) -> DFResult<Arc<dyn TableProvider>> {
        let signature = "copy_rejects('<namespace>.<table>')";
        at_most(args, 1, "copy_rejects", signature)?;
        let table = string_arg(args, 0, "copy_rejects", signature)?;
        Ok(CommandTable::on_table(table, |table| CopyRejects { table }))
    }
}
