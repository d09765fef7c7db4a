//! Which file of a folder source an update failed on, when the reader's
//! error does not say (DataFusion's CSV, JSON and Parquet readers name no
//! file): found after the failure, by reading the files again one by one.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::common::DataFusionError;
use datafusion::datasource::listing::{ListingTable, ListingTableConfig};
use datafusion::execution::session_state::SessionState;

use super::checkpoint::SourceCheckpoint;
use super::folders::list_files;
use crate::fold::columns::all_nullable;

/// Which file of a folder a failed read (`failure`) failed on, when the
/// error does not say (DataFusion's CSV, JSON and Parquet readers name no
/// file): the flow `flow`'s folders' files not read yet (by its source
/// checkpoint `checkpoint`) are read again one by one, up to the first that
/// fails as `failure` did (the same error at its root: a file that fails
/// otherwise — in a column the flow's query leaves out, say — is not
/// blamed). Only after a failure that came from reading data
/// ([`is_read_error`]), so the cost is that of a failed update's reading
/// once more. `None`: no folder, or no file fails so alone.
pub(crate) async fn file_that_fails(
    state: &SessionState,
    flow: &crate::spec::FlowSpec,
    checkpoint: Option<&str>,
    failure: &DataFusionError,
) -> Option<(String, DataFusionError)> {
    let cause = failure.find_root().to_string();
    use datafusion::physical_plan::execute_stream;
    use futures::StreamExt;

    let checkpoint: Option<SourceCheckpoint> =
        checkpoint.and_then(|c| serde_json::from_str(c).ok());
    let names = super::dependencies::flow_reads(flow).ok()?;
    for name in names {
        let reference =
            datafusion::common::TableReference::partial(name.schema.clone(), name.table.clone());
        let Ok(schema) = state.schema_for_ref(reference.clone()) else {
            continue;
        };
        let Ok(Some(provider)) = schema.table(reference.table()).await else {
            continue;
        };
        let Some(listing) = provider.downcast_ref::<ListingTable>() else {
            continue;
        };
        let read: BTreeSet<String> = match &checkpoint {
            Some(SourceCheckpoint::Files { files }) => files.clone(),
            Some(SourceCheckpoint::Streams { folders, .. }) => folders
                .iter()
                .find(|(written, _)| {
                    written.rsplit('.').next().map(|t| t.trim_matches('"'))
                        == Some(name.table.as_str())
                })
                .map(|(_, files)| files.clone())
                .unwrap_or_default(),
            _ => BTreeSet::new(),
        };
        let Ok((files, empty)) = list_files(state, listing).await else {
            continue;
        };
        let schema = all_nullable(listing.schema().as_ref());
        for file in files {
            if read.contains(&file.location) || empty.contains(&file.location) {
                continue;
            }
            let shown = file.url.as_str().to_string();
            let config = ListingTableConfig::new_with_multi_paths(vec![file.url])
                .with_listing_options(listing.options().clone())
                .with_schema(Arc::clone(&schema));
            let failed = async {
                let table = ListingTable::try_new(config)?;
                let plan = table.scan(state, None, &[], None).await?;
                let mut stream = execute_stream(plan, state.task_ctx())?;
                while let Some(batch) = stream.next().await {
                    batch?;
                }
                Ok::<(), DataFusionError>(())
            }
            .await;
            match failed {
                Err(e) if e.find_root().to_string() == cause => {
                    return Some((format!("file '{shown}' of '{name}'"), e));
                }
                _ => {}
            }
        }
    }
    None
}

/// Whether `e` may have come from reading data (a reader's or the store's
/// error), rather than from the rules of an update or a computation of the
/// query (a division by zero, an overflow).
pub(crate) fn is_read_error(e: &DataFusionError) -> bool {
    use arrow::error::ArrowError;
    match e.find_root() {
        DataFusionError::ArrowError(e, _) => !matches!(
            e.as_ref(),
            ArrowError::DivideByZero
                | ArrowError::ArithmeticOverflow(_)
                | ArrowError::ComputeError(_)
                | ArrowError::NotYetImplemented(_)
        ),
        DataFusionError::ParquetError(..)
        | DataFusionError::ObjectStore(..)
        | DataFusionError::IoError(..) => true,
        _ => false,
    }
}
