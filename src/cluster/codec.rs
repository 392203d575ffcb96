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

use super::recipe::{Recipe, RecipeScanExec, RecipeTable};

/// The first bytes of an icestage table in a logical plan.
const TABLE_TAG: &[u8] = b"icestage.recipe-table\0";
/// The first bytes of an icestage scan in a physical plan.
const SCAN_TAG: &[u8] = b"icestage.recipe-scan\0";

/// The logical codec scheduler, executors and clients share.
#[derive(Debug, Default)]
pub struct IcestageLogicalCodec {
    inner: BallistaLogicalExtensionCodec,
}

/// The physical codec scheduler and executors share.
#[derive(Debug, Default)]
pub struct IcestagePhysicalCodec {
    inner: BallistaPhysicalExtensionCodec,
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
    serde_json::to_writer(buf, value).map_err(|e| DataFusionError::External(Box::new(e)))
}

fn decode_json<T: for<'de> Deserialize<'de>>(body: &[u8], what: &str) -> DFResult<T> {
    serde_json::from_slice(body).map_err(|e| {
        DataFusionError::Internal(format!(
            "cannot decode icestage's {what} ({e}): scheduler, executors and client must be the \
             same icestage build"
        ))
    })
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
        self.inner.try_decode(buf, inputs, ctx)
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> DFResult<()> {
        self.inner.try_encode(node, buf)
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> DFResult<Arc<dyn TableProvider>> {
        match tagged(buf, TABLE_TAG) {
            Some(body) => Ok(Arc::new(RecipeTable {
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
        match tagged(buf, SCAN_TAG) {
            Some(body) => {
                let message: ScanMessage = decode_json(body, "scan")?;
                Ok(Arc::new(RecipeScanExec::new(
                    message.recipe,
                    schema_from_hex(&message.schema)?,
                    message.partitions,
                    message.files,
                )))
            }
            None => self.inner.try_decode(buf, inputs, ctx),
        }
    }

    fn try_encode(&self, node: Arc<dyn ExecutionPlan>, buf: &mut Vec<u8>) -> DFResult<()> {
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
