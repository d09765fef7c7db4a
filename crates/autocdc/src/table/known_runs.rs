//! The flows' last runs at one version of a state store, remembered so that
//! an update need not replay the log to number its run.
//!
//! A flow's run number is the `txn` version of its application id in the
//! state store's log ([`super::properties::checkpoint_app_id`]); finding it
//! replays the log's commits from the newest back to the flow's last run.
//! A table remembers what it found or committed, for one version only:
//!
//! | event                                                       | remembered afterwards |
//! |-------------------------------------------------------------|-----------------------|
//! | a lookup at version v                                       | the runs known at v, with this one |
//! | a commit built on v, landing at v + 1, remembered at v        | the runs known at v, moved to v + 1, with the commit's runs |
//! | a commit landing elsewhere (rebased past another writer's), or built on another version | nothing |
//! | any other version read (another writer's commit, a commit not reported here) | nothing is used: the version differs |

use std::collections::HashMap;
use std::sync::Mutex;

/// Runs known at one version (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct KnownRuns {
    known: Mutex<Option<(u64, Runs)>>,
}

/// The last run of each application id (`None`: known to have none).
type Runs = HashMap<String, Option<i64>>;

impl KnownRuns {
    /// The last run of `app_id` at `version`, if remembered (`Some(None)`:
    /// known to have none).
    pub(crate) fn get(&self, version: u64, app_id: &str) -> Option<Option<i64>> {
        let known = self.known.lock().ok()?;
        match known.as_ref() {
            Some((at, runs)) if *at == version => runs.get(app_id).copied(),
            _ => None,
        }
    }

    /// Forget every run (the table was read anew).
    pub(crate) fn forget(&self) {
        if let Ok(mut known) = self.known.lock() {
            *known = None;
        }
    }

    /// Remember that `app_id`'s last run at `version` is `run`.
    pub(crate) fn found(&self, version: u64, app_id: &str, run: Option<i64>) {
        if let Ok(mut known) = self.known.lock() {
            match known.as_mut() {
                Some((at, runs)) if *at == version => {
                    runs.insert(app_id.to_string(), run);
                }
                _ => *known = Some((version, HashMap::from([(app_id.to_string(), run)]))),
            }
        }
    }

    /// A commit built on version `built_on` landed at `landed` with the
    /// runs `runs` (application id, run).
    pub(crate) fn committed(&self, built_on: u64, landed: u64, runs: &[(String, i64)]) {
        if let Ok(mut known) = self.known.lock() {
            match known.as_mut() {
                Some((at, known_runs)) if *at == built_on && landed == built_on + 1 => {
                    *at = landed;
                    for (app_id, run) in runs {
                        known_runs.insert(app_id.clone(), Some(*run));
                    }
                }
                _ => *known = None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_row_of_the_table() {
        let runs = KnownRuns::default();
        assert_eq!(runs.get(3, "f"), None);
        // a lookup
        runs.found(3, "f", Some(2));
        runs.found(3, "g", None);
        assert_eq!(runs.get(3, "f"), Some(Some(2)));
        assert_eq!(runs.get(3, "g"), Some(None));
        assert_eq!(runs.get(4, "f"), None);
        // a commit on 3 landing at 4: moved, with its runs
        runs.committed(3, 4, &[("g".to_string(), 1)]);
        assert_eq!(runs.get(4, "f"), Some(Some(2)));
        assert_eq!(runs.get(4, "g"), Some(Some(1)));
        assert_eq!(runs.get(3, "f"), None);
        // a commit without runs (DML) on 4 landing at 5
        runs.committed(4, 5, &[]);
        assert_eq!(runs.get(5, "f"), Some(Some(2)));
        // rebased past another writer's commit: forgotten
        runs.committed(5, 7, &[("f".to_string(), 3)]);
        assert_eq!(runs.get(7, "f"), None);
        assert_eq!(runs.get(5, "f"), None);
        // built on a version not remembered: forgotten
        runs.found(7, "f", Some(3));
        runs.committed(6, 7, &[]);
        assert_eq!(runs.get(7, "f"), None);
        // a lookup at another version starts over
        runs.found(8, "f", Some(3));
        runs.found(9, "g", Some(1));
        assert_eq!(runs.get(9, "f"), None);
        assert_eq!(runs.get(9, "g"), Some(Some(1)));
    }
}
