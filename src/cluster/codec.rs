//! How icestage's plan pieces cross the wire to a Ballista scheduler and its
//! executors. Each codec answers for icestage's own node and hands every
//! other to Ballista's (which in turn knows DataFusion's and its shuffles).
//!
//! A node travels as a tag and a JSON body: the tag tells icestage's bytes
//! from Ballista's, the body is small (a [`Recipe`], never a file list).

use std::sync::Arc;

use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::common::TableReference;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Extension, LogicalPlan};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::PhysicalExtensionCodec;
use prost::Message;
use serde::{Deserialize, Serialize};

use super::job::{JobExec, JobTable, Jobs, decode_message, encode_message};
use super::recipe::{Recipe, RecipeScanExec, RecipeTable};
use super::write::{WriteExec, WriteNode, WriteTarget};

/// The first bytes of an icestage table in a logical plan.
const TABLE_TAG: &[u8] = b"icestage.recipe-table\0";
/// The first bytes of an icestage scan in a physical plan.
const SCAN_TAG: &[u8] = b"icestage.recipe-scan\0";
/// The first bytes of an icestage write, logical or physical.
const WRITE_TAG: &[u8] = b"icestage.write\0";
/// The first bytes of an icestage job, logical or physical: then its kind,
/// a NUL, and the job's own bytes.
const JOB_TAG: &[u8] = b"icestage.job\0";

/// The logical codec scheduler, executors and clients share. A client only
/// encodes; a scheduler decodes the jobs it is given.
#[derive(Debug, Default)]
pub struct IcestageLogicalCodec {
    inner: BallistaLogicalExtensionCodec,
    jobs: Jobs,
}

/// The physical codec scheduler and executors share.
#[derive(Debug, Default)]
pub struct IcestagePhysicalCodec {
    inner: BallistaPhysicalExtensionCodec,
    jobs: Jobs,
}

impl IcestageLogicalCodec {
    /// A codec that also decodes `jobs`.
    pub fn new(jobs: Jobs) -> Self {
        Self {
            jobs,
            ..Self::default()
        }
    }
}

impl IcestagePhysicalCodec {
    /// A codec that also decodes `jobs`.
    pub fn new(jobs: Jobs) -> Self {
        Self {
            jobs,
            ..Self::default()
        }
    }
}

fn encode_job(job: &dyn super::job::Job, buf: &mut Vec<u8>) -> DFResult<()> {
    buf.extend_from_slice(JOB_TAG);
    buf.extend_from_slice(job.kind().as_bytes());
    buf.push(0);
    buf.extend_from_slice(&job.encode()?);
    Ok(())
}

fn decode_job(jobs: &Jobs, body: &[u8]) -> DFResult<Arc<dyn super::job::Job>> {
    let at = body
        .iter()
        .position(|b| *b == 0)
        .ok_or_else(|| DataFusionError::Internal("an icestage job without its kind".to_string()))?;
    let kind = String::from_utf8_lossy(&body[..at]);
    Ok(jobs.decode(&kind, &body[at + 1..])?)
}

/// A [`RecipeScanExec`] as it travels.
#[derive(Serialize, Deserialize)]
struct ScanMessage {
    recipe: Recipe,
    /// The output schema, as DataFusion's protobuf, hex-encoded.
    schema: String,
    partitions: usize,
    files: usize,
}

fn tagged<'a>(buf: &'a [u8], tag: &[u8]) -> Option<&'a [u8]> {
    buf.strip_prefix(tag)
}

fn encode_json(tag: &[u8], value: &impl Serialize, buf: &mut Vec<u8>) -> DFResult<()> {
    buf.extend_from_slice(tag);
    buf.extend_from_slice(&encode_message(value)?);
    Ok(())
}

fn decode_json<T: for<'de> Deserialize<'de>>(body: &[u8], what: &str) -> DFResult<T> {
    Ok(decode_message(body, &format!("icestage's {what}"))?)
}

fn schema_to_hex(schema: &Schema) -> DFResult<String> {
    let proto = datafusion_proto::protobuf::Schema::try_from(schema)?;
    Ok(hex::encode(proto.encode_to_vec()))
}

fn schema_from_hex(text: &str) -> DFResult<SchemaRef> {
    let bytes = hex::decode(text).map_err(|e| DataFusionError::External(Box::new(e)))?;
    let proto = datafusion_proto::protobuf::Schema::decode(bytes.as_slice())
        .map_err(|e| DataFusionError::External(Box::new(e)))?;
    Ok(Arc::new(Schema::try_from(&proto)?))
}

impl LogicalExtensionCodec for IcestageLogicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[LogicalPlan],
        ctx: &TaskContext,
    ) -> DFResult<Extension> {
        match (tagged(buf, WRITE_TAG), inputs) {
            (Some(body), [input]) => Ok(Extension {
                node: Arc::new(WriteNode::new(
                    decode_json::<WriteTarget>(body, "write")?,
                    input.clone(),
                )?),
            }),
            (Some(_), _) => Err(DataFusionError::Internal(
                "icestage's write takes exactly one input".to_string(),
            )),
            (None, _) => self.inner.try_decode(buf, inputs, ctx),
        }
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> DFResult<()> {
        match node.node.as_any().downcast_ref::<WriteNode>() {
            Some(write) => encode_json(WRITE_TAG, &write.target, buf),
            None => self.inner.try_encode(node, buf),
        }
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> DFResult<Arc<dyn TableProvider>> {
        if let Some(body) = tagged(buf, JOB_TAG) {
            return Ok(Arc::new(JobTable(decode_job(&self.jobs, body)?)));
        }
        match tagged(buf, TABLE_TAG) {
            Some(body) => Ok(Arc::new(RecipeTable {
                opened: None,
                recipe: decode_json(body, "table recipe")?,
                schema,
            })),
            None => self
                .inner
                .try_decode_table_provider(buf, table_ref, schema, ctx),
        }
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> DFResult<()> {
        if let Some(job) = node.as_any().downcast_ref::<JobTable>() {
            return encode_job(job.0.as_ref(), buf);
        }
        match node.as_any().downcast_ref::<RecipeTable>() {
            Some(table) => encode_json(TABLE_TAG, &table.recipe, buf),
            None => self.inner.try_encode_table_provider(table_ref, node, buf),
        }
    }
}

impl PhysicalExtensionCodec for IcestagePhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if let Some(body) = tagged(buf, JOB_TAG) {
            return Ok(Arc::new(JobExec::new(decode_job(&self.jobs, body)?)));
        }
        if let Some(body) = tagged(buf, SCAN_TAG) {
            let message: ScanMessage = decode_json(body, "scan")?;
            return Ok(Arc::new(RecipeScanExec::new(
                message.recipe,
                schema_from_hex(&message.schema)?,
                message.partitions,
                message.files,
            )));
        }
        match (tagged(buf, WRITE_TAG), inputs) {
            (Some(body), [input]) => Ok(Arc::new(WriteExec::new(
                decode_json(body, "write")?,
                Arc::clone(input),
            ))),
            (Some(_), _) => Err(DataFusionError::Internal(
                "icestage's write takes exactly one input".to_string(),
            )),
            (None, _) => self.inner.try_decode(buf, inputs, ctx),
        }
    }

    fn try_encode(&self, node: Arc<dyn ExecutionPlan>, buf: &mut Vec<u8>) -> DFResult<()> {
        if let Some(job) = node.as_any().downcast_ref::<JobExec>() {
            return encode_job(job.job.as_ref(), buf);
        }
        if let Some(write) = node.as_any().downcast_ref::<WriteExec>() {
            return encode_json(WRITE_TAG, &write.target, buf);
        }
        match node.as_any().downcast_ref::<RecipeScanExec>() {
            Some(scan) => encode_json(
                SCAN_TAG,
                &ScanMessage {
                    recipe: scan.recipe.clone(),
                    schema: schema_to_hex(&scan.schema)?,
                    partitions: scan.partitions,
                    files: scan.files,
                },
                buf,
            ),
            None => self.inner.try_encode(node, buf),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use datafusion::arrow::datatypes::{DataType, Field};
    use datafusion::prelude::SessionContext;

    use super::*;

    fn recipe() -> Recipe {
        Recipe {
            table: "payments.transactions".to_string(),
            metadata_location:
                "s3://warehouse/payments/transactions/metadata/00003-x.metadata.json".to_string(),
            snapshot_id: Some(7),
            file_io: HashMap::from([("s3.region".to_string(), "eu-west-1".to_string())]),
            files: None,
            filter: None,
        }
    }

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false).with_metadata(HashMap::from([(
                "PARQUET:field_id".to_string(),
                "1".to_string(),
            )])),
            Field::new("note", DataType::Utf8, true),
        ]))
    }

    #[test]
    fn a_recipe_table_round_trips() {
        let codec = IcestageLogicalCodec::default();
        let table = Arc::new(RecipeTable {
            recipe: recipe(),
            schema: schema(),
            opened: None,
        });
        let name = TableReference::bare("t");
        let mut buf = vec![];
        codec
            .try_encode_table_provider(&name, table, &mut buf)
            .unwrap();
        assert!(buf.len() < 512, "a recipe stays small: {} bytes", buf.len());
        let ctx = SessionContext::new();
        let decoded = codec
            .try_decode_table_provider(&buf, &name, schema(), &ctx.task_ctx())
            .unwrap();
        let decoded = decoded.as_any().downcast_ref::<RecipeTable>().unwrap();
        assert_eq!(decoded.recipe, recipe());
        assert_eq!(decoded.schema, schema());
    }

    #[test]
    fn a_recipe_scan_round_trips() {
        let codec = IcestagePhysicalCodec::default();
        let scan = Arc::new(RecipeScanExec::new(recipe(), schema(), 3, 10));
        let mut buf = vec![];
        codec.try_encode(scan, &mut buf).unwrap();
        let ctx = SessionContext::new();
        let decoded = codec.try_decode(&buf, &[], &ctx.task_ctx()).unwrap();
        let decoded = decoded.as_any().downcast_ref::<RecipeScanExec>().unwrap();
        assert_eq!(decoded.recipe, recipe());
        assert_eq!(decoded.schema, schema());
        assert_eq!((decoded.partitions, decoded.files), (3, 10));
        assert_eq!(decoded.properties().partitioning.partition_count(), 3);
    }

    #[test]
    fn a_write_round_trips_logically_and_physically() {
        let target = WriteTarget {
            table: recipe(),
            prefix: "icestage-download-x".to_string(),
        };
        let ctx = SessionContext::new();
        let input = datafusion::logical_expr::LogicalPlanBuilder::empty(true)
            .build()
            .unwrap();
        let logical = IcestageLogicalCodec::default();
        let node = Extension {
            node: Arc::new(WriteNode::new(target.clone(), input.clone()).unwrap()),
        };
        let mut buf = vec![];
        logical.try_encode(&node, &mut buf).unwrap();
        let decoded = logical
            .try_decode(&buf, std::slice::from_ref(&input), &ctx.task_ctx())
            .unwrap();
        let decoded = decoded.node.as_any().downcast_ref::<WriteNode>().unwrap();
        assert_eq!(decoded.target, target);
        assert!(logical.try_decode(&buf, &[], &ctx.task_ctx()).is_err());

        let physical = IcestagePhysicalCodec::default();
        let scan: Arc<dyn ExecutionPlan> = Arc::new(RecipeScanExec::new(recipe(), schema(), 2, 4));
        let write = Arc::new(WriteExec::new(target.clone(), Arc::clone(&scan)));
        let mut buf = vec![];
        physical.try_encode(write, &mut buf).unwrap();
        let decoded = physical.try_decode(&buf, &[scan], &ctx.task_ctx()).unwrap();
        let decoded = decoded.as_any().downcast_ref::<WriteExec>().unwrap();
        assert_eq!(decoded.target, target);
        assert_eq!(decoded.properties().partitioning.partition_count(), 2);
    }

    /// A job that answers its partition's number and its text.
    #[derive(Debug, PartialEq)]
    struct Echo(String);

    impl super::super::job::Job for Echo {
        fn kind(&self) -> &'static str {
            "test.echo"
        }
        fn encode(&self) -> crate::error::Result<Vec<u8>> {
            Ok(self.0.as_bytes().to_vec())
        }
        fn partitions(&self) -> usize {
            3
        }
        fn run(
            &self,
            partition: usize,
        ) -> futures::future::BoxFuture<'static, crate::error::Result<Vec<String>>> {
            let text = format!("{partition}:{}", self.0);
            Box::pin(async move { Ok(vec![text]) })
        }
    }

    fn echo(bytes: &[u8]) -> crate::error::Result<Arc<dyn super::super::job::Job>> {
        Ok(Arc::new(Echo(String::from_utf8_lossy(bytes).into_owned())))
    }

    #[tokio::test]
    async fn a_job_round_trips_and_runs_where_it_is_decoded() {
        let jobs = Jobs::default().with("test.echo", echo);
        let ctx = SessionContext::new();
        let job: Arc<dyn super::super::job::Job> = Arc::new(Echo("hi".to_string()));

        let logical = IcestageLogicalCodec::new(jobs.clone());
        let mut buf = vec![];
        let name = TableReference::bare("job");
        logical
            .try_encode_table_provider(&name, Arc::new(JobTable(Arc::clone(&job))), &mut buf)
            .unwrap();
        let table = logical
            .try_decode_table_provider(&buf, &name, job_schema(), &ctx.task_ctx())
            .unwrap();
        assert!(table.as_any().downcast_ref::<JobTable>().is_some());
        // A process without the decoder says what is wrong.
        let error = IcestageLogicalCodec::default()
            .try_decode_table_provider(&buf, &name, job_schema(), &ctx.task_ctx())
            .unwrap_err();
        assert!(error.to_string().contains("test.echo"), "{error}");

        let physical = IcestagePhysicalCodec::new(jobs);
        let mut buf = vec![];
        physical
            .try_encode(Arc::new(JobExec::new(job)), &mut buf)
            .unwrap();
        let decoded = physical.try_decode(&buf, &[], &ctx.task_ctx()).unwrap();
        let batches = datafusion::physical_plan::collect_partitioned(decoded, ctx.task_ctx())
            .await
            .unwrap();
        let rows: Vec<String> = batches
            .iter()
            .flatten()
            .map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<datafusion::arrow::array::StringArray>()
                    .unwrap()
                    .value(0)
                    .to_string()
            })
            .collect();
        assert_eq!(rows, ["0:hi", "1:hi", "2:hi"]);
    }

    fn job_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![datafusion::arrow::datatypes::Field::new(
            "result",
            datafusion::arrow::datatypes::DataType::Utf8,
            false,
        )]))
    }

    #[test]
    fn other_nodes_go_to_ballistas_codec() {
        let codec = IcestagePhysicalCodec::default();
        let ctx = SessionContext::new();
        // Bytes that are not icestage's reach the inner codec, which refuses
        // them in its own words instead of icestage misreading them.
        let error = codec
            .try_decode(b"not a plan", &[], &ctx.task_ctx())
            .unwrap_err();
        assert!(!error.to_string().contains("icestage"), "{error}");
    }
}
