//! When each commit of a streaming table was made, as Delta readers' time
//! travel sees it.
//!
//! The Delta protocol (without in-commit timestamps) times a version by the
//! modification time of its commit file, and that is what `TIMESTAMP AS OF`
//! of Spark, delta-rs (Polars) and delta-kernel readers resolves by. The
//! table those readers read is the published table at the target's path,
//! whose commit for a state version is written a few milliseconds after the
//! state store's. So `event_log`'s `commit_timestamp`, `table_as_of(t,
//! TIMESTAMP …)`, `RESTORE … TIMESTAMP AS OF` and a downstream flow's
//! `newest_input_at` all take the published commit file's time: a time the
//! event log shows resolves to the same version here and in any Delta
//! reader.
//!
//! | version                                   | its time                                      |
//! |-------------------------------------------|-----------------------------------------------|
//! | published                                 | the published commit file's modification time |
//! | committed, not published yet              | the state commit's own time (`commitInfo`)    |
//! | table of the earlier layout (no published)| its own commit file's modification time       |
//! | log entry cleaned up                      | none                                          |

use std::collections::BTreeMap;

use datafusion::common::Result;
use deltalake_core::DeltaTable;
use object_store::ObjectStoreExt;

use super::delta_err;

/// The version a commit file of a log is for (`None`: not a commit file).
fn commit_version(file_name: &str) -> Option<u64> {
    let digits = file_name.strip_suffix(".json")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// The modification time (ms since the epoch) of every commit file still in
/// the log of `table` (which need not be loaded): one listing.
pub(crate) async fn commit_file_times(table: &DeltaTable) -> Result<BTreeMap<u64, i64>> {
    let log_store = table.log_store();
    let store = log_store.object_store(None);
    let log = log_store.log_path();
    let listing = store
        .list_with_delimiter(Some(log))
        .await
        .map_err(delta_err)?;
    Ok(listing
        .objects
        .into_iter()
        .filter_map(|file| {
            let version = commit_version(file.location.filename()?)?;
            Some((version, file.last_modified.timestamp_millis()))
        })
        .collect())
}

/// The modification time of the commit file of `version` in the log of
/// `table` (`None`: there is none).
pub(crate) async fn commit_file_time(table: &DeltaTable, version: u64) -> Result<Option<i64>> {
    let log_store = table.log_store();
    let path = log_store
        .log_path()
        .clone()
        .join(format!("{version:020}.json"));
    match log_store.object_store(None).head(&path).await {
        Ok(meta) => Ok(Some(meta.last_modified.timestamp_millis())),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(delta_err(e)),
    }
}

/// The newest version of `times` made at or before `ms` (`None`: every
/// version is later).
pub(crate) fn version_at(times: &BTreeMap<u64, i64>, ms: i64) -> Option<u64> {
    times
        .iter()
        .filter(|&(_, &at)| at <= ms)
        .map(|(&version, _)| version)
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_commit_files_name_a_version() {
        assert_eq!(commit_version("00000000000000000012.json"), Some(12));
        for other in [
            "00000000000000000012.checkpoint.parquet",
            "00000000000000000012.crc",
            "_last_checkpoint",
            "12.json",
            "0000000000000000001x.json",
        ] {
            assert_eq!(commit_version(other), None, "{other}");
        }
    }

    #[test]
    fn the_version_at_a_time_is_the_newest_made_by_then() {
        let times = BTreeMap::from([(0, 100), (1, 200), (2, 200), (3, 300)]);
        assert_eq!(version_at(&times, 99), None);
        assert_eq!(version_at(&times, 100), Some(0));
        assert_eq!(version_at(&times, 250), Some(2));
        assert_eq!(version_at(&times, 1_000), Some(3));
        // a version whose log entry is gone is skipped
        let cleaned = BTreeMap::from([(2, 200), (3, 300)]);
        assert_eq!(version_at(&cleaned, 250), Some(2));
        assert_eq!(version_at(&cleaned, 150), None);
    }
}
