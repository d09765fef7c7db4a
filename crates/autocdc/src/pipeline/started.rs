//! A snapshot diff that was started while its update was planned, resumed
//! by the update's plan instead of being run a second time.
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
//!  update:   StartedDiff (one partition) = pulled batches ++ rest of the stream ─► AutoCdc
//! ```

use std::fmt;
use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::catalog::TableProvider;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use futures::StreamExt;

/// The changes of a running diff: what was pulled, and the rest. It can be
/// executed once.
pub struct StartedDiff {
    flow: String,
    schema: SchemaRef,
    state: Mutex<Option<(Vec<RecordBatch>, SendableRecordBatchStream)>>,
}

impl fmt::Debug for StartedDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StartedDiff")
            .field("flow", &self.flow)
            .finish()
    }
}

impl StartedDiff {
    /// The changes of `flow`'s diff: `pulled`, then what `rest` yields.
    pub fn new(flow: &str, pulled: Vec<RecordBatch>, rest: SendableRecordBatchStream) -> Self {
        Self {
            flow: flow.to_string(),
            schema: rest.schema(),
            state: Mutex::new(Some((pulled, rest))),
        }
    }

    /// A one-partition table of the changes.
    pub fn into_provider(self) -> Result<Arc<dyn TableProvider>> {
        let schema = Arc::clone(&self.schema);
        Ok(Arc::new(StreamingTable::try_new(
            schema,
            vec![Arc::new(self)],
        )?))
    }
}

impl PartitionStream for StartedDiff {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let taken = match self.state.lock() {
            Ok(mut state) => state.take(),
            Err(_) => None,
        };
        let schema = Arc::clone(&self.schema);
        match taken {
            Some((pulled, rest)) => Box::pin(RecordBatchStreamAdapter::new(
                schema,
                futures::stream::iter(pulled.into_iter().map(Ok)).chain(rest),
            )),
            None => {
                let error = DataFusionError::Execution(format!(
                    "flow '{}': the snapshot diff started while planning was already read; plan the update again",
                    self.flow
                ));
                Box::pin(RecordBatchStreamAdapter::new(
                    schema,
                    futures::stream::once(async move { Err(error) }),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{AsArray, Int64Array};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};
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
        let started = StartedDiff::new("f", vec![batch(&schema, vec![1, 2])], Box::pin(rest));
        let ctx = SessionContext::new();
        ctx.register_table("changes", started.into_provider()?)?;
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
