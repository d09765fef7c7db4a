//! The data files of a table's loaded version, and the key bucket of each.

use datafusion::common::Result;
use deltalake_core::kernel::LogicalFileView;
use futures::TryStreamExt;

use super::bucket::BUCKET_COL;
use super::delta_err;

/// The data files of `table`'s loaded version.
pub(crate) async fn data_files(table: &deltalake_core::DeltaTable) -> Result<Vec<LogicalFileView>> {
    let snapshot = table.snapshot().map_err(delta_err)?;
    snapshot
        .snapshot()
        .file_views(table.log_store().as_ref(), None)
        .try_collect()
        .await
        .map_err(delta_err)
}

/// The key bucket of a data file (`None`: not partitioned by bucket).
pub(crate) fn bucket_of(view: &LogicalFileView) -> Option<i32> {
    view.partition_values_map()
        .get(BUCKET_COL)
        .cloned()
        .flatten()
        .and_then(|b| b.parse::<i32>().ok())
}
