//! A run started while an update was planned, resumed by the update's plan
//! instead of being run a second time: a snapshot diff, or change events
//! too many to stage in memory ([`super::staged`]).
//!
//! An update by snapshot first runs its diff to learn whether the change is
//! small enough for deletion vectors. The diff is a blocking operator: by
//! the time it emits its first change it has read both sides whole. When
//! more changes come out than deletion vectors take, the update rewrites
//! the touched buckets, and its plan reads the changes from here: the
//! changes already pulled, then the rest of the same running stream.
//!
//! ```text
//!  planning: SnapshotDiff ─► pull up to the budget + 1 ─► over budget
//!                                                         │
//!  update:   one partition = pulled batches ++ rest of the stream ─► AutoCdc
//! ```

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::catalog::TableProvider;
use datafusion::common::Result;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;

use crate::physical::one_shot::OneShotPartition;

/// A running stream as a one-partition table that can be read once:
/// `pulled`, then what `rest` yields. `what` names it in the error of a
/// second read.
pub fn resume_stream(
    what: String,
    pulled: Vec<RecordBatch>,
    rest: SendableRecordBatchStream,
) -> Result<Arc<dyn TableProvider>> {
    let schema = rest.schema();
    let rows = futures::stream::iter(pulled.into_iter().map(Ok)).chain(rest);
    let rows: SendableRecordBatchStream =
        Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&schema), rows));
    let partition = OneShotPartition::new(what, rows);
    Ok(Arc::new(StreamingTable::try_new(
        schema,
        vec![Arc::new(partition)],
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{AsArray, Int64Array};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
    use datafusion::prelude::SessionContext;

    fn batch(schema: &SchemaRef, values: Vec<i64>) -> RecordBatch {
        RecordBatch::try_new(Arc::clone(schema), vec![Arc::new(Int64Array::from(values))]).unwrap()
    }

    /// The pulled batches come first, then the rest of the stream; a second
    /// execution is an error naming the flow.
    #[tokio::test]
    async fn pulled_then_rest_once() -> Result<()> {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let rest = RecordBatchStreamAdapter::new(
            Arc::clone(&schema),
            futures::stream::iter(vec![
                Ok(batch(&schema, vec![3])),
                Ok(batch(&schema, vec![4, 5])),
            ]),
        );
        let changes = resume_stream(
            "flow 'f': the snapshot diff started while planning".to_string(),
            vec![batch(&schema, vec![1, 2])],
            Box::pin(rest),
        )?;
        let ctx = SessionContext::new();
        ctx.register_table("changes", changes)?;
        let batches = ctx.sql("SELECT id FROM changes").await?.collect().await?;
        let ids: Vec<i64> = batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        assert_eq!(ids, vec![1, 2, 3, 4, 5]);
        let err = ctx
            .sql("SELECT id FROM changes")
            .await?
            .collect()
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("flow 'f': the snapshot diff started while planning was already read"),
            "{err}"
        );
        Ok(())
    }
}
