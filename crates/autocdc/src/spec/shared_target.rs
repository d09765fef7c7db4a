//! Rules between the flows of one target, checked when a flow is
//! defined, before anything is created.
//!
//! | rule                                                     | clause      |
//! |----------------------------------------------------------|-------------|
//! | flow names are unique per target                         | (name)      |
//! | at most one snapshot flow per target                     | FROM        |
//! | snapshot and change-feed flows share only SCD 1 targets  | STORED AS   |
//! | one key per target: KEYS are equal as sets of columns    | KEYS        |
//! | SCD 2 flows track the same columns                       | TRACK HISTORY ON |
//! | SCD 2 flows share IGNORE NULL UPDATES / COLUMNS TO UPDATE | (options)  |
//!
//! Column names are compared as the target names them (an unquoted name
//! matches its column case-insensitively, like every other clause).

use std::collections::BTreeSet;
use std::fmt::Display;

use datafusion::common::{DataFusionError, Result};

use super::{ColumnSelection, FlowSpec, ScdType};

/// Check that `spec` may join `others`, the flows already defined on
/// `target` whose columns are `target_columns` (empty until a flow or a
/// declaration fixed them).
pub fn check_joins_target<'a>(
    spec: &FlowSpec,
    others: impl IntoIterator<Item = &'a FlowSpec> + Clone,
    target: &impl Display,
    target_columns: &[String],
) -> Result<()> {
    let flow = &spec.name;
    let plan_err = |msg: String| Err(DataFusionError::Plan(format!("flow '{flow}': {msg}")));
    if others.clone().into_iter().any(|f| f.name == spec.name) {
        return plan_err(format!(
            "a flow of that name already exists on target '{target}'"
        ));
    }
    let snapshot_flows = others
        .clone()
        .into_iter()
        .filter(|f| f.source.is_snapshot())
        .count();
    let cdc_flows = others.clone().into_iter().count() - snapshot_flows;
    if spec.source.is_snapshot() && snapshot_flows > 0 {
        return plan_err(format!(
            "target '{target}' already has a snapshot flow; a target takes at most one"
        ));
    }
    let mixing = if spec.source.is_snapshot() {
        cdc_flows > 0
    } else {
        snapshot_flows > 0
    };
    if mixing && spec.stored_as_scd_type != ScdType::Type1 {
        return plan_err(
            "snapshot and change-feed flows can share only an SCD TYPE 1 target".to_string(),
        );
    }
    // the reference: "the AUTO CDC flows do not use IGNORE NULL UPDATES" on
    // a target that also takes snapshots (a snapshot states whole rows)
    if mixing {
        let partial = |f: &FlowSpec| !f.source.is_snapshot() && f.ignore_null_updates.is_some();
        let clash = if partial(spec) {
            Some(spec)
        } else {
            others.clone().into_iter().find(|f| partial(f))
        };
        if let Some(cdc) = clash {
            return plan_err(format!(
                "IGNORE NULL UPDATES: target '{target}' takes snapshots and AUTO CDC flows, whose flows do not use IGNORE NULL UPDATES (flow '{}' does)",
                cdc.name
            ));
        }
    }
    // one key per target, a set of columns (a name that is no target column
    // is left to the flow's own validation, which names its clause)
    let keys = name_set(&spec.keys, target_columns);
    if let Some(other) = others
        .clone()
        .into_iter()
        .find(|f| name_set(&f.keys, target_columns) != keys)
        .filter(|_| all_known(&spec.keys, target_columns))
    {
        return plan_err(format!(
            "KEYS ({}) differ from the key of target '{target}', KEYS ({}) of flow '{}'; a target has one key (its columns may be listed in any order)",
            spec.keys.join(", "),
            other.keys.join(", "),
            other.name
        ));
    }
    if spec.stored_as_scd_type == ScdType::Type2 {
        // SCD 2 re-merges every stored event under the running flow's
        // partial-update option: all flows of the target must share it
        if let Some(other) = others.clone().into_iter().find(|f| {
            f.ignore_null_updates != spec.ignore_null_updates
                || f.columns_to_update.is_some() != spec.columns_to_update.is_some()
        }) {
            return plan_err(format!(
                "IGNORE NULL UPDATES / COLUMNS TO UPDATE must be the same for every flow of {} target '{target}' (flow '{}' differs)",
                spec.stored_as_scd_type, other.name
            ));
        }
        // and re-folds every key's history over one tracked set
        check_tracked_alike(spec, others, target, target_columns)?;
    }
    Ok(())
}

/// Check that the SCD 2 flow `spec` tracks the columns every other SCD 2
/// flow of `target` (`others`) tracks over `target_columns`: when `spec` is
/// defined, and again at each of its updates over the columns the target
/// has after it (a column it adds is tracked by a flow without TRACK
/// HISTORY, or with `* EXCEPT`, and not by a flow listing its columns).
pub fn check_tracked_alike<'a>(
    spec: &FlowSpec,
    others: impl IntoIterator<Item = &'a FlowSpec>,
    target: &impl Display,
    target_columns: &[String],
) -> Result<()> {
    let tracked = tracked_set(spec, target_columns);
    let listed = match &spec.track_history {
        Some(ColumnSelection::Only(list) | ColumnSelection::Except(list)) => list.as_slice(),
        None | Some(ColumnSelection::All) => &[],
    };
    if !all_known(listed, target_columns) {
        // (the flow's own validation names the unknown column)
        return Ok(());
    }
    let Some(other) = others.into_iter().find(|f| {
        f.name != spec.name
            && f.stored_as_scd_type == ScdType::Type2
            && tracked_set(f, target_columns) != tracked
    }) else {
        return Ok(());
    };
    let list = |set: &BTreeSet<String>| set.iter().cloned().collect::<Vec<_>>().join(", ");
    Err(DataFusionError::Plan(format!(
        "flow '{}': TRACK HISTORY ON: the flow tracks ({}) but flow '{}' of target '{target}' \
         tracks ({}); every SCD TYPE 2 flow of a target tracks the same columns (the \
         target's columns: {})",
        spec.name,
        list(&tracked),
        other.name,
        list(&tracked_set(other, target_columns)),
        target_columns.join(", ")
    )))
}

/// `names` as the target names them (unknown names lower-cased).
fn name_set(names: &[String], target_columns: &[String]) -> BTreeSet<String> {
    names
        .iter()
        .map(|name| canonical(name, target_columns))
        .collect()
}

fn canonical(name: &str, target_columns: &[String]) -> String {
    target_column(name, target_columns)
        .cloned()
        .unwrap_or_else(|| name.to_ascii_lowercase())
}

fn target_column<'a>(name: &str, target_columns: &'a [String]) -> Option<&'a String> {
    target_columns
        .iter()
        .find(|c| *c == name)
        .or_else(|| target_columns.iter().find(|c| c.eq_ignore_ascii_case(name)))
}

/// Whether every name is a target column (or the target has none yet).
fn all_known(names: &[String], target_columns: &[String]) -> bool {
    target_columns.is_empty()
        || names
            .iter()
            .all(|n| target_column(n, target_columns).is_some())
}

/// The tracked columns of an SCD 2 flow over `target_columns`: every
/// non-key column unless TRACK HISTORY narrows it.
fn tracked_set(spec: &FlowSpec, target_columns: &[String]) -> BTreeSet<String> {
    let keys = name_set(&spec.keys, target_columns);
    let non_keys = || {
        target_columns
            .iter()
            .filter(|c| !keys.contains(*c))
            .cloned()
    };
    match &spec.track_history {
        None | Some(ColumnSelection::All) => non_keys().collect(),
        Some(ColumnSelection::Only(list)) => name_set(list, target_columns),
        Some(ColumnSelection::Except(list)) => {
            let excluded = name_set(list, target_columns);
            non_keys().filter(|c| !excluded.contains(c)).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::FlowSource;

    fn flow(name: &str, keys: &[&str]) -> FlowSpec {
        let mut f = FlowSpec::new(name, "t", FlowSource::Table("src".into()));
        f.keys = keys.iter().map(|k| k.to_string()).collect();
        f
    }

    fn columns() -> Vec<String> {
        ["id", "region", "name", "city"]
            .iter()
            .map(|c| c.to_string())
            .collect()
    }

    #[test]
    fn keys_are_a_set() {
        let first = flow("f1", &["id", "region"]);
        let second = flow("f2", &["REGION", "id"]);
        assert!(check_joins_target(&second, [&first], &"t", &columns()).is_ok());

        let third = flow("f3", &["id"]);
        let err = check_joins_target(&third, [&first], &"t", &columns())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("flow 'f3': KEYS (id) differ from the key of target 't', KEYS (id, region) of flow 'f1'"),
            "{err}"
        );
    }

    #[test]
    fn scd2_flows_track_the_same_columns() {
        let scd2 = |name: &str, track: Option<ColumnSelection>| {
            let mut f = flow(name, &["id"]);
            f.stored_as_scd_type = ScdType::Type2;
            f.track_history = track;
            f
        };
        let all = scd2("f1", None);
        // the same set written another way
        let same = scd2(
            "f2",
            Some(ColumnSelection::Only(vec![
                "city".into(),
                "name".into(),
                "region".into(),
            ])),
        );
        assert!(check_joins_target(&same, [&all], &"t", &columns()).is_ok());
        let narrower = scd2("f3", Some(ColumnSelection::Except(vec!["city".into()])));
        let err = check_joins_target(&narrower, [&all], &"t", &columns())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("TRACK HISTORY ON: the flow tracks (name, region) but flow 'f1' of target 't' tracks (city, name, region)"),
            "{err}"
        );
    }
}
